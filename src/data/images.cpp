#include "data/images.h"

#include <fmt/format.h>

#include <cmath>

#include "core/util.h"
#include "data/idx.h"

namespace mf {

static ImageSplit read_split(const std::string& dir, const std::string& prefix) {
  ImageSplit s;
  const std::string images = dir + "/" + prefix + "-images-idx3-ubyte.gz";
  const std::string labels = dir + "/" + prefix + "-labels-idx1-ubyte.gz";
  s.images = read_idx_gz(images, 3);
  s.labels = read_idx_gz(labels, 1).to(at::kLong);
  if (s.images.size(0) != s.labels.size(0))
    throw DataError(
        fmt::format("{}: {} images but {} has {} labels", images, s.images.size(0), labels, s.labels.size(0)));
  return s;
}

// The images of `s` whose label is one of `keep` (a bool per class).
static ImageSplit only_classes(const ImageSplit& s, const at::Tensor& keep) {
  const auto rows = keep.index_select(0, s.labels).nonzero().squeeze(1);
  return {s.images.index_select(0, rows), s.labels.index_select(0, rows)};
}

ImageDataset::ImageDataset(const std::string& dir, int64_t val, const std::vector<int64_t>& classes) {
  auto all = read_split(dir, "train");
  test_ = read_split(dir, "t10k");
  const int64_t n = all.images.size(0);
  if (val < 0 || val >= n)
    throw DataError(fmt::format("data.val_images = {} must leave training images (the train split has {})", val, n));
  train_ = {all.images.narrow(0, 0, n - val), all.labels.narrow(0, 0, n - val)};
  val_ = {all.images.narrow(0, n - val, val), all.labels.narrow(0, n - val, val)};
  if (test_.images.sizes().slice(1) != train_.images.sizes().slice(1))
    throw DataError(fmt::format("{}: test images are {}, train images {}", dir, c10::str(test_.images.sizes()),
                                c10::str(train_.images.sizes())));
  num_classes_ = std::max(train_.labels.max().item<int64_t>(), test_.labels.max().item<int64_t>()) + 1;
  auto pixels = train_.images.to(at::kDouble) / 255.0;
  mean = pixels.mean().item<double>();
  std = pixels.std().item<double>();
  if (classes.empty()) return;
  auto keep = at::zeros({num_classes_}, at::kBool);
  for (const auto k : classes) {
    if (k < 0 || k >= num_classes_)
      throw DataError(fmt::format("data.classes: {} has no class {} (its labels are 0-{})", dir, k, num_classes_ - 1));
    keep[k] = true;
  }
  train_ = only_classes(train_, keep), val_ = only_classes(val_, keep), test_ = only_classes(test_, keep);
  if (train_.labels.numel() == 0) throw DataError(fmt::format("data.classes: {} has no training images of them", dir));
}

const ImageSplit& ImageDataset::split(const std::string& name) const {
  if (name == "train") return train_;
  if (name == "val") return val_;
  if (name == "test") return test_;
  throw DataError("unknown image split '" + name + "' (train, val, test)");
}

at::Tensor ImageDataset::normalize(const at::Tensor& images_BYX) const {
  return ((images_BYX.to(at::kFloat) / 255.0 - mean) / std).unsqueeze(1);
}

const std::vector<std::string>& ImageDataset::class_names() {
  static const std::vector<std::string> n = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                             "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};
  return n;
}

ImageSampler::ImageSampler(const ImageDataset& data, uint64_t seed, bool augment, int64_t pad, double erase)
    : data_(data), seed_(seed), augment_(augment), pad_(pad), erase_(erase) {}

std::optional<Rectangle> draw_erase_rectangle(int64_t Y, int64_t X, SplitMix64& rng) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double area = (0.02 + 0.38 * rng.uniform()) * static_cast<double>(Y * X);
    const double aspect = std::exp(std::log(0.3) + (std::log(1 / 0.3) - std::log(0.3)) * rng.uniform());
    const auto h = static_cast<int64_t>(std::lround(std::sqrt(area * aspect)));
    const auto w = static_cast<int64_t>(std::lround(std::sqrt(area / aspect)));
    if (h < 1 || w < 1 || h > Y || w > X) continue;
    const auto y = static_cast<int64_t>(rng.below(static_cast<uint64_t>(Y - h + 1)));
    const auto x = static_cast<int64_t>(rng.below(static_cast<uint64_t>(X - w + 1)));
    return Rectangle{y, x, h, w};
  }
  return std::nullopt;
}

void erase_rectangle(at::Tensor& image_YX, SplitMix64& rng, uint8_t fill) {
  if (auto r = draw_erase_rectangle(image_YX.size(0), image_YX.size(1), rng)) {
    image_YX = image_YX.clone();
    image_YX.narrow(0, r->y, r->h).narrow(1, r->x, r->w).fill_(fill);
  }
}

// Each image is written straight into the uint8 batch: a per-image tensor op costs more than the
// 784 pixels it moves, and the batch is on every training step's path.
ImageBatch ImageSampler::sample(int64_t step, int64_t micro, int64_t batch_size) const {
  const auto& train = data_.split("train");
  const int64_t n = train.images.size(0), Y = train.images.size(1), X = train.images.size(2);
  const auto source = train.images.contiguous();
  const uint8_t* pixels = source.data_ptr<uint8_t>();
  auto batch_BYX = at::empty({batch_size, Y, X}, source.options());
  uint8_t* out = batch_BYX.data_ptr<uint8_t>();
  const auto fill = static_cast<uint8_t>(std::lround(data_.mean * 255));
  SplitMix64 rng(mix_seed(seed_, static_cast<uint64_t>(step), static_cast<uint64_t>(micro)));
  std::vector<int64_t> index;
  for (int64_t b = 0; b < batch_size; ++b) {
    const auto i = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)));
    index.push_back(i);
    const uint8_t* image = pixels + i * Y * X;
    uint8_t* dst = out + b * Y * X;
    if (!augment_) {
      std::copy(image, image + Y * X, dst);
      continue;
    }
    // the crop at (dy, dx) of the image zero-padded by pad_, then mirrored with probability 1/2
    const auto dy = static_cast<int64_t>(rng.below(2 * pad_ + 1)) - pad_;
    const auto dx = static_cast<int64_t>(rng.below(2 * pad_ + 1)) - pad_;
    const bool flip = rng.below(2) == 1;
    for (int64_t r = 0; r < Y; ++r)
      for (int64_t c = 0; c < X; ++c) {
        const int64_t y = r + dy, x = (flip ? X - 1 - c : c) + dx;
        dst[r * X + c] = y >= 0 && y < Y && x >= 0 && x < X ? image[y * X + x] : 0;
      }
    if (erase_ > 0 && rng.uniform() < erase_)
      if (auto e = draw_erase_rectangle(Y, X, rng))
        for (int64_t r = e->y; r < e->y + e->h; ++r) std::fill_n(dst + r * X + e->x, e->w, fill);
  }
  auto labels = train.labels.index_select(0, at::tensor(index, at::kLong));
  return {data_.normalize(batch_BYX), labels};
}

ImageBatch image_range(const ImageDataset& data, const std::string& split, int64_t begin, int64_t count) {
  const auto& s = data.split(split);
  count = std::min(count, s.images.size(0) - begin);
  return {data.normalize(s.images.narrow(0, begin, count)), s.labels.narrow(0, begin, count)};
}

}  // namespace mf
