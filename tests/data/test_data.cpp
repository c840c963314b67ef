// Corpus extraction, shards, the batch sampler and data preparation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <zlib.h>

#include <filesystem>
#include <set>

#include "core/util.h"
#include "data/corpus.h"
#include "data/idx.h"
#include "data/images.h"
#include "data/prepare.h"
#include "data/shards.h"
#include "data/tokenizer.h"

using namespace mf;
namespace fs = std::filesystem;

TEST(Sanitize, ControlCharsOverstrikeAndUtf8) {
  EXPECT_EQ(sanitize_text("a\tb\r\nc\x01"), "a b\nc");
  EXPECT_EQ(sanitize_text("_\bX_\bY"), "XY");
  EXPECT_EQ(sanitize_text("caf\xc3\xa9 \xff ok"), "caf\xc3\xa9  ok");
  EXPECT_EQ(sanitize_text("\xe2\x82"), "");  // truncated sequence dropped
}

TEST(Corpus, GcideEntriesLoseMarkup) {
  const std::string text =
      "00-database-short\n   The Collaborative International Dictionary\n\n"
      "Alleyway \\Al\"ley*way`\\n.\n   An alley.\n   [1913 Webster]\n\n"
      "All hail \\All` hail\"\\ [All + hail, interj.]\n   All health; see {Halloween}.\n   [1913 Webster]\n\n"
      "12 \\12\\ adj.\n   1. twelve\n\n   Syn: twelve, xii, dozen\n        [WordNet 1.5 +PJC]\n";
  auto docs = parse_gcide(text);
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "Alleyway n.\nAn alley.");
  EXPECT_EQ(docs[1], "All hail [All + hail, interj.]\nAll health; see Halloween.");
  EXPECT_EQ(docs[2], "12 adj.\n1. twelve\nSyn: twelve, xii, dozen");
}

TEST(Corpus, BibleChaptersWithoutVerseNumbers) {
  auto docs = parse_bible("\nGenesis 1\n\n  1 In the beginning.\n  2 And the earth.\n\nGenesis 2\n\n  1 Thus.\n");
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "Genesis 1\nIn the beginning.\nAnd the earth.");
  EXPECT_EQ(docs[1], "Genesis 2\nThus.");
}

TEST(Corpus, FortunesAndParagraphs) {
  auto q = parse_fortunes("First quote\n  -- A\n%\nSecond\n%\n\n%\n");
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0], "First quote\n  -- A");
  auto p = parse_paragraphs("aaaa\nbbbb\n\ncccc\n\n\ndddd\n", 8);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], "aaaa\nbbbb");
  EXPECT_EQ(p[1], "cccc\n\ndddd");
}

TEST(Shards, RoundTripAndCorruptionDetected) {
  auto dir = fs::temp_directory_path() / "mf_shard_test";
  fs::create_directories(dir);
  auto path = (dir / "s.bin").string();
  std::vector<uint16_t> toks = {1, 2, 3, 999, 0};
  write_token_shard(path, toks, 1000);
  EXPECT_EQ(read_token_shard(path, 1000), toks);
  EXPECT_THROW(read_token_shard(path, 500), std::runtime_error);  // vocab mismatch
  auto bytes = read_file(path);
  write_file_atomic(path, bytes.substr(0, bytes.size() - 2));
  EXPECT_THROW(read_token_shard(path, 1000), std::runtime_error);  // truncated
  bytes[bytes.size() - 1] ^= 1;
  write_file_atomic(path, bytes);
  EXPECT_THROW(read_token_shard(path, 1000), std::runtime_error);  // checksum
  fs::remove_all(dir);
}

TEST(Entropy, HandComputed) {
  // p = (1/4, 1/4, 1/2): H = 1.5 ln 2
  EXPECT_NEAR(unigram_entropy({1, 1, 2, 0}), 1.5 * std::log(2.0), 1e-12);
  EXPECT_NEAR(unigram_entropy({5, 5, 5, 5}), std::log(4.0), 1e-12);
}

TEST(Windows, EvenlySpacedAndShifted) {
  std::vector<uint16_t> toks(20);
  for (int i = 0; i < 20; ++i) toks[i] = static_cast<uint16_t>(i);
  auto b = fixed_windows(toks, 4, 3);
  EXPECT_EQ(b.inputs[0][0].item<int64_t>(), 0);
  EXPECT_EQ(b.inputs[2][3].item<int64_t>(), 18);  // last window ends at the last target
  EXPECT_EQ(b.targets[2][3].item<int64_t>(), 19);
  EXPECT_TRUE(torch::equal(b.targets.narrow(1, 0, 3), b.inputs.narrow(1, 1, 3)));
  EXPECT_THROW(fixed_windows(toks, 20, 1), std::runtime_error);
}

class PreparedData : public ::testing::Test {
 protected:
  static DataConfig config(const std::string& name) {
    DataConfig c;
    c.dir = (fs::temp_directory_path() / name).string();
    c.max_source_bytes = 60000;
    c.tokenizer_sample_bytes = 30000;
    c.vocab_size = 400;
    return c;
  }
};

TEST_F(PreparedData, DeterministicIdempotentAndLoadable) {
  auto a = config("mf_data_a"), b = config("mf_data_b");
  fs::remove_all(a.dir), fs::remove_all(b.dir);
  auto ra = prepare_corpus(a, false);
  EXPECT_FALSE(ra.skipped);
  auto rb = prepare_corpus(b, false);
  EXPECT_EQ(ra.manifest["domains"], rb.manifest["domains"]);
  EXPECT_EQ(ra.manifest["tokenizer"]["checksum"], rb.manifest["tokenizer"]["checksum"]);
  for (auto& d : ra.manifest["domains"])
    for (auto& s : split_names()) {
      auto f = d["splits"][s]["file"].get<std::string>();
      EXPECT_EQ(file_checksum(a.dir + "/" + f), file_checksum(b.dir + "/" + f)) << f;
      EXPECT_GT(d["splits"][s]["tokens"].get<int64_t>(), 0) << f;
    }
  EXPECT_TRUE(prepare_corpus(a, false).skipped);
  a.vocab_size = 420;  // changed input: rebuilt
  EXPECT_FALSE(prepare_corpus(a, false).skipped);

  PreparedCorpus corpus(b.dir);
  EXPECT_EQ(corpus.domains(), (std::vector<std::string>{"dictionary", "scripture", "technical", "quotations"}));
  Tokenizer tok(corpus.tokenizer_path());
  const std::string text = "In the beginning\n  int main() { return 0; } \xc3\xa9";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);  // byte fallback: lossless
  // re-tokenizing a split (how a Hugging Face model is evaluated) gives the prepared shard itself
  for (const auto& split : {"val", "test"}) {
    const auto streams = retokenized_split(b, tok, split);
    ASSERT_EQ(streams.size(), corpus.domains().size());
    for (size_t d = 0; d < streams.size(); ++d) {
      const auto& shard = corpus.tokens(d, split);
      EXPECT_EQ(streams[d].second, std::vector<int>(shard.begin(), shard.end())) << streams[d].first << " " << split;
    }
  }

  BatchSampler s1(corpus, {1, 1, 1, 1}, 16, 42), s2(corpus, {1, 1, 1, 1}, 16, 42), s3(corpus, {1, 1, 1, 1}, 16, 43);
  auto x = s1.sample(5, 0, 8), y = s2.sample(5, 0, 8);
  EXPECT_TRUE(torch::equal(x.inputs, y.inputs));
  EXPECT_TRUE(torch::equal(x.inputs.narrow(1, 1, 15), x.targets.narrow(1, 0, 15)));
  EXPECT_FALSE(torch::equal(x.inputs, s1.sample(6, 0, 8).inputs));
  EXPECT_FALSE(torch::equal(x.inputs, s1.sample(5, 1, 8).inputs));
  EXPECT_FALSE(torch::equal(x.inputs, s3.sample(5, 0, 8).inputs));

  // mixture weights: only scripture -> every window comes from scripture's train split
  BatchSampler only(corpus, {0, 1, 0, 0}, 8, 1);
  const auto& scripture = corpus.tokens(1, "train");
  auto z = only.sample(0, 0, 4);
  for (int64_t r = 0; r < 4; ++r) {
    bool found = false;
    for (size_t st = 0; st + 8 <= scripture.size() && !found; ++st) {
      bool eq = true;
      for (int64_t t = 0; t < 8 && eq; ++t) eq = scripture[st + t] == z.inputs[r][t].item<int64_t>();
      found = eq;
    }
    EXPECT_TRUE(found) << "row " << r;
  }

  // a damaged shard makes loading fail with a clear message
  auto shard = a.dir + "/tokens/quotations.val.bin";
  auto bytes = read_file(shard);
  write_file_atomic(shard, bytes.substr(0, bytes.size() / 2));
  try {
    PreparedCorpus broken(a.dir);
    FAIL() << "truncated shard accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("quotations.val.bin"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(prepare_corpus(a, false).skipped);  // and prepare repairs it
  fs::remove_all(a.dir), fs::remove_all(b.dir);
}

namespace {
std::string temp_file(const std::string& name) { return (fs::temp_directory_path() / ("mf_idx_" + name)).string(); }
void write_gz_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}
std::string idx_error(const std::string& path, int64_t dims) {
  try {
    read_idx_gz(path, dims);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Idx, RoundTripAndEveryBrokenFileNamesItself) {
  const auto good = temp_file("good.gz");
  auto images = torch::randint(0, 256, {5, 4, 3}, torch::kLong).to(torch::kByte);
  write_idx_gz(good, images);
  EXPECT_TRUE(torch::equal(read_idx_gz(good, 3), images));
  // wrong number of dimensions (labels read as images) -> wrong magic
  EXPECT_NE(idx_error(good, 1).find("magic"), std::string::npos);
  // not gzip
  const auto plain = temp_file("plain");
  write_file_atomic(plain, "plain bytes, not gzip");
  EXPECT_NE(idx_error(plain, 1).find("not a gzip file"), std::string::npos);
  // header says 4 items, 2 bytes follow: truncated; 3 bytes for 2 items: trailing bytes
  const auto trunc = temp_file("trunc.gz"), extra = temp_file("extra.gz");
  write_gz_bytes(trunc, {0, 0, 8, 1, 0, 0, 0, 4, 7, 9});
  write_gz_bytes(extra, {0, 0, 8, 1, 0, 0, 0, 2, 7, 9, 11});
  EXPECT_NE(idx_error(trunc, 1).find("truncated"), std::string::npos);
  EXPECT_NE(idx_error(extra, 1).find("after the IDX payload"), std::string::npos);
  for (auto& p : {plain, trunc, extra}) EXPECT_EQ(idx_error(p, 1).rfind(p, 0), 0u) << "the error starts with the file";
  for (auto& p : {good, plain, trunc, extra}) fs::remove(p);
}

TEST(Images, FashionMnistSplitsNormalisationAndDeterministicBatches) {
  ImageDataset data("/usr/share/datasets/fashion-mnist", 5000);
  EXPECT_EQ(data.split("train").images.size(0), 55000);
  EXPECT_EQ(data.split("val").images.size(0), 5000);
  EXPECT_EQ(data.split("test").images.size(0), 10000);
  EXPECT_EQ(data.num_classes(), 10);
  EXPECT_EQ(data.image_size(), 28);
  EXPECT_NEAR(data.mean, 0.286, 0.01);  // the dataset's known pixel statistics
  EXPECT_NEAR(data.std, 0.353, 0.01);
  auto all = data.normalize(data.split("train").images);
  EXPECT_NEAR(all.mean().item<double>(), 0.0, 1e-3);
  EXPECT_NEAR(all.std().item<double>(), 1.0, 1e-3);
  ImageSampler sampler(data, 7, /*augment=*/true);
  auto a = sampler.sample(3, 1, 16), b = sampler.sample(3, 1, 16), c = sampler.sample(4, 1, 16);
  EXPECT_TRUE(torch::equal(a.images, b.images));  // a pure function of (seed, step, micro)
  EXPECT_TRUE(torch::equal(a.labels, b.labels));
  EXPECT_FALSE(torch::equal(a.images, c.images));
  EXPECT_EQ(a.images.sizes(), (std::vector<int64_t>{16, 1, 28, 28}));
  // without augmentation a batch is exactly the normalised training images it drew
  ImageSampler plain(data, 7, /*augment=*/false);
  auto p = plain.sample(3, 1, 4);
  auto train = data.normalize(data.split("train").images);
  for (int64_t i = 0; i < 4; ++i) {
    bool found = false;
    for (int64_t j = 0; j < train.size(0) && !found; ++j) found = torch::equal(train[j], p.images[i]);
    EXPECT_TRUE(found) << i;
  }
  EXPECT_THROW(ImageDataset("/nonexistent", 10), DataError);
  EXPECT_THROW(ImageDataset("/usr/share/datasets/fashion-mnist", 60000), DataError);
}

TEST(Images, AClassSubsetKeepsExactlyItsImagesInEverySplitAndTheNormalisation) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  ImageDataset all(dir, 5000), some(dir, 5000, {0, 2, 4, 6});
  EXPECT_EQ(some.num_classes(), 10);
  EXPECT_EQ(some.mean, all.mean);  // the model sees pixels normalised as in pretraining
  EXPECT_EQ(some.std, all.std);
  for (const char* split : {"train", "val", "test"}) {
    const auto& a = all.split(split);
    const auto& s = some.split(split);
    const auto keep = (a.labels == 0) | (a.labels == 2) | (a.labels == 4) | (a.labels == 6);
    EXPECT_EQ(s.labels.size(0), keep.sum().item<int64_t>()) << split;
    EXPECT_TRUE(torch::equal(s.labels, a.labels.masked_select(keep))) << split;  // same images, same order
    const auto rows = keep.nonzero().squeeze(1);
    EXPECT_TRUE(torch::equal(s.images, a.images.index_select(0, rows))) << split;
  }
  EXPECT_EQ(some.split("test").labels.size(0), 4000);  // 1,000 test images per class
  EXPECT_THROW(ImageDataset(dir, 5000, {3, 10}), DataError);
}

TEST(Images, AugmentationShiftsByAtMostThePaddingAndFlips) {
  // four training images, each black but one pixel whose place is known from the label
  const auto dir = fs::temp_directory_path() / "mf_idx_synthetic";
  fs::create_directories(dir);
  const int64_t rows[] = {6, 10, 14, 18}, cols[] = {5, 9, 16, 21};
  auto images = torch::zeros({4, 28, 28}, torch::kByte);
  for (int64_t i = 0; i < 4; ++i) images[i][rows[i]][cols[i]] = 255;
  write_idx_gz((dir / "train-images-idx3-ubyte.gz").string(), images);
  write_idx_gz((dir / "train-labels-idx1-ubyte.gz").string(), torch::arange(4, torch::kLong));
  write_idx_gz((dir / "t10k-images-idx3-ubyte.gz").string(), images.narrow(0, 0, 2));
  write_idx_gz((dir / "t10k-labels-idx1-ubyte.gz").string(), torch::arange(2, torch::kLong));
  ImageDataset data(dir.string(), 0);
  ImageSampler sampler(data, 3, /*augment=*/true, /*pad=*/2);
  std::set<int64_t> shifts;
  int flipped = 0, kept = 0;
  for (int64_t step = 0; step < 20; ++step) {
    auto b = sampler.sample(step, 0, 8);
    for (int64_t i = 0; i < 8; ++i) {
      const auto label = b.labels[i].item<int64_t>();
      auto at = b.images[i][0].argmax().item<int64_t>();
      const int64_t r = at / 28, c = at % 28;
      EXPECT_LE(std::abs(r - rows[label]), 2);
      const bool plain = std::abs(c - cols[label]) <= 2, mirrored = std::abs(c - (27 - cols[label])) <= 2;
      EXPECT_TRUE(plain || mirrored) << "column " << c << " for a pixel at " << cols[label];
      flipped += mirrored;
      kept += plain;
      shifts.insert((r - rows[label]) * 10 + (plain ? c - cols[label] : c - (27 - cols[label])));
    }
  }
  EXPECT_GT(flipped, 30);  // about half of 160
  EXPECT_GT(kept, 30);
  EXPECT_GT(shifts.size(), 15u);  // of the 25 offsets in [-2, 2]^2
  // no padding: flips only, the pixel stays on its row and on its column or the mirrored one
  ImageSampler flips(data, 3, /*augment=*/true, /*pad=*/0);
  for (int64_t step = 0; step < 5; ++step) {
    auto b = flips.sample(step, 0, 8);
    for (int64_t i = 0; i < 8; ++i) {
      const auto label = b.labels[i].item<int64_t>();
      auto at = b.images[i][0].argmax().item<int64_t>();
      EXPECT_EQ(at / 28, rows[label]);
      EXPECT_TRUE(at % 28 == cols[label] || at % 28 == 27 - cols[label]);
    }
  }
  fs::remove_all(dir);
}

// The sampler writes pixels by hand; this is the same batch from tensor operations: zero
// padding, a crop, a flip, erase_rectangle, with the draws in the sampler's order.
TEST(Images, SamplerEqualsTheTensorOpReference) {
  ImageDataset data("/usr/share/datasets/fashion-mnist", 5000);
  const auto& train = data.split("train");
  for (const int64_t pad : {0, 2}) {
    ImageSampler sampler(data, 11, /*augment=*/true, pad, /*erase=*/0.5);
    for (int64_t step : {0, 5}) {
      SplitMix64 rng(mix_seed(11, static_cast<uint64_t>(step), 1));
      std::vector<at::Tensor> images;
      for (int64_t b = 0; b < 32; ++b) {
        auto img = train.images[static_cast<int64_t>(rng.below(static_cast<uint64_t>(train.images.size(0))))];
        const auto dy = static_cast<int64_t>(rng.below(2 * pad + 1));
        const auto dx = static_cast<int64_t>(rng.below(2 * pad + 1));
        img = torch::constant_pad_nd(img, {pad, pad, pad, pad}, 0).narrow(0, dy, 28).narrow(1, dx, 28);
        if (rng.below(2) == 1) img = img.flip({1});
        if (rng.uniform() < 0.5) erase_rectangle(img, rng, static_cast<uint8_t>(std::lround(data.mean * 255)));
        images.push_back(img);
      }
      EXPECT_TRUE(torch::equal(sampler.sample(step, 1, 32).images, data.normalize(torch::stack(images))))
          << "pad " << pad << " step " << step;
    }
  }
}

TEST(Images, RandomErasingSetsOneRectangleOfTheDocumentedSize) {
  std::set<int64_t> areas;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    SplitMix64 rng(seed);
    auto img = torch::full({28, 28}, 200, torch::kUInt8);
    const auto before = img.clone();
    erase_rectangle(img, rng, 7);
    EXPECT_TRUE(before.equal(torch::full({28, 28}, 200, torch::kUInt8))) << "the input was changed in place";
    auto erased = img.eq(7);
    const int64_t n = erased.sum().item<int64_t>();
    ASSERT_GT(n, 0) << "seed " << seed;
    EXPECT_EQ(n + img.eq(200).sum().item<int64_t>(), 784) << "other pixels changed";
    auto rows = erased.any(1).nonzero(), cols = erased.any(0).nonzero();
    const int64_t h = rows.max().item<int64_t>() - rows.min().item<int64_t>() + 1;
    const int64_t w = cols.max().item<int64_t>() - cols.min().item<int64_t>() + 1;
    EXPECT_EQ(h * w, n) << "not one filled rectangle, seed " << seed;
    // area U(0.02, 0.4) of 784 = [15.7, 313.6], sides rounded: a little slack either way
    EXPECT_GE(n, 9);
    EXPECT_LE(n, 350);
    areas.insert(n);
  }
  EXPECT_GT(areas.size(), 50u);  // the draws vary
}
