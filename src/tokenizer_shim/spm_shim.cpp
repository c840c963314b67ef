// A C shim around SentencePiece, loaded with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
// Why: Debian's libsentencepiece bundles and exports its own protobuf 3.14 while
// LibTorch loads the system libprotobuf 3.21; linked into one process they interpose
// each other's symbols and crash at start-up. Loaded this way each keeps its own.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace sentencepiece {
void SetRandomGeneratorSeed(unsigned int seed);  // exported by libsentencepiece, not in its headers
}

namespace {

// Feeds training sentences from one buffer, one per line (no input file, so no path
// ends up in the model and the result depends on the text alone).
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  LineIterator(const char* text, size_t len) : text_(text), len_(len) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (pos_ < len_) {
      const char* nl = static_cast<const char*>(std::memchr(text_ + pos_, '\n', len_ - pos_));
      size_t end = nl ? static_cast<size_t>(nl - text_) : len_;
      line_.assign(text_ + pos_, end - pos_);
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return sentencepiece::util::Status(); }

 private:
  const char* text_;
  size_t len_, pos_ = 0;
  std::string line_;
  bool done_ = false;
};

void set_err(const std::string& msg, char* err, size_t n) {
  if (err && n) {
    std::strncpy(err, msg.c_str(), n - 1);
    err[n - 1] = '\0';
  }
}
}  // namespace

extern "C" {

void* mfspm_load(const char* path, char* err, size_t errlen) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  auto st = sp->Load(path);
  if (!st.ok()) {
    set_err(st.ToString(), err, errlen);
    delete sp;
    return nullptr;
  }
  return sp;
}

void mfspm_free(void* h) { delete static_cast<sentencepiece::SentencePieceProcessor*>(h); }

int mfspm_info(void* h, int what) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  switch (what) {
    case 0: return sp->GetPieceSize();
    case 1: return sp->eos_id();
    case 2: return sp->bos_id();
    default: return sp->unk_id();
  }
}

// Piece `id`: its text (*len bytes, owned by the processor) and score; returns its SentencePiece type
// (1 normal, 2 unknown, 3 control, 5 unused, 6 byte: llama.cpp's token types use the same numbers).
int mfspm_piece(void* h, int id, const char** text, size_t* len, float* score) {
  auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(h);
  const auto& piece = sp->IdToPiece(id);
  *text = piece.data();
  *len = piece.size();
  *score = sp->GetScore(id);
  return sp->IsUnknown(id) ? 2 : sp->IsControl(id) ? 3 : sp->IsUnused(id) ? 5 : sp->IsByte(id) ? 6 : 1;
}

// ids are malloc'ed; the caller releases them with free()
int mfspm_encode(void* h, const char* text, size_t len, int** ids, size_t* n, char* err, size_t errlen) {
  std::vector<int> out;
  auto st = static_cast<sentencepiece::SentencePieceProcessor*>(h)->Encode(std::string(text, len), &out);
  if (!st.ok()) return set_err(st.ToString(), err, errlen), 1;
  *n = out.size();
  *ids = static_cast<int*>(std::malloc(sizeof(int) * (out.size() + 1)));
  std::memcpy(*ids, out.data(), sizeof(int) * out.size());
  return 0;
}

int mfspm_decode(void* h, const int* ids, size_t n, char** text, size_t* len, char* err, size_t errlen) {
  std::string out;
  auto st = static_cast<sentencepiece::SentencePieceProcessor*>(h)->Decode(std::vector<int>(ids, ids + n), &out);
  if (!st.ok()) return set_err(st.ToString(), err, errlen), 1;
  *len = out.size();
  *text = static_cast<char*>(std::malloc(out.size() + 1));
  std::memcpy(*text, out.data(), out.size());
  return 0;
}

// model bytes are malloc'ed; the caller releases them with free()
int mfspm_train(const char* args, const char* text, size_t len, unsigned seed, char** model, size_t* model_len,
                char* err, size_t errlen) {
  sentencepiece::SetRandomGeneratorSeed(seed);
  LineIterator lines(text, len);
  std::string proto;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  if (!st.ok()) return set_err(st.ToString(), err, errlen), 1;
  *model_len = proto.size();
  *model = static_cast<char*>(std::malloc(proto.size() + 1));
  std::memcpy(*model, proto.data(), proto.size());
  return 0;
}

}  // extern "C"
