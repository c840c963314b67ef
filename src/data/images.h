// Image classification data: Fashion-MNIST from Debian's dataset-fashion-mnist package
// (/usr/share/datasets/fashion-mnist: train-* 60,000 and t10k-* 10,000 28x28 grey images, 10
// classes). The last `val` training images form the validation split (fixed, no shuffling),
// the rest train; t10k is the test split. Pixels are scaled to [0, 1] and normalised with the
// mean and std of the training split. With `classes`, every split keeps only those classes'
// images (normalisation and num_classes stay the whole dataset's).
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace mf {

struct SplitMix64;

struct ImageSplit {
  at::Tensor images;  // uint8 [B, Y, X]
  at::Tensor labels;  // int64 [B]
};

struct ImageBatch {
  at::Tensor images;  // float [B, 1, Y, X], normalised
  at::Tensor labels;  // int64 [B]
};

class ImageDataset {
 public:
  ImageDataset(const std::string& dir, int64_t val, const std::vector<int64_t>& classes = {});
  const ImageSplit& split(const std::string& name) const;  // train | val | test
  int64_t num_classes() const { return num_classes_; }
  int64_t image_size() const { return train_.images.size(1); }
  at::Tensor normalize(const at::Tensor& images_BYX) const;  // uint8 -> float [B, 1, Y, X]
  double mean = 0, std = 1;                                  // of the training pixels in [0, 1]
  static const std::vector<std::string>& class_names();

 private:
  ImageSplit train_, val_, test_;
  int64_t num_classes_ = 0;
};

// Training batches: batch (step, micro) depends only on (seed, step, micro), so a resumed run
// sees the same images. With `augment`, each image is shifted by up to `pad` pixels (zero
// padding, then a random crop) and flipped horizontally with probability 1/2, then with
// probability `erase` a random rectangle is set to the mean pixel (random erasing).
class ImageSampler {
 public:
  ImageSampler(const ImageDataset& data, uint64_t seed, bool augment, int64_t pad = 2, double erase = 0);
  ImageBatch sample(int64_t step, int64_t micro, int64_t batch_size) const;

 private:
  const ImageDataset& data_;
  uint64_t seed_;
  bool augment_;
  int64_t pad_;
  double erase_;
};

// Random erasing (Zhong et al. 2017, sl = 0.02, sh = 0.4, r1 = 0.3): a rectangle of area
// fraction U(0.02, 0.4) and aspect ratio log-uniform in [0.3, 1/0.3], retried until it fits,
// set to `fill`. Draws from `rng` only.
void erase_rectangle(at::Tensor& image_YX, SplitMix64& rng, uint8_t fill);
struct Rectangle {
  int64_t y, x, h, w;  // top row, left column, height, width
};
// the rectangle erase_rectangle fills (none after 10 draws that do not fit)
std::optional<Rectangle> draw_erase_rectangle(int64_t Y, int64_t X, SplitMix64& rng);

// Images [begin, begin + count) of a split, unaugmented (evaluation).
ImageBatch image_range(const ImageDataset& data, const std::string& split, int64_t begin, int64_t count);

}  // namespace mf
