// apex_C for the lab's Apex stand-in: flatten a list of dense tensors into one 1-D buffer and
// unflatten such a buffer back into views shaped like a list of tensors. Written for p40fleet.
#include <torch/extension.h>

#include <vector>

namespace {

at::Tensor flatten(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(!tensors.empty(), "flatten: expected a non-empty list of tensors");
  std::vector<at::Tensor> pieces;
  pieces.reserve(tensors.size());
  for (const auto& t : tensors) {
    pieces.push_back(t.contiguous().view({-1}));
  }
  return at::cat(pieces, 0);
}

std::vector<at::Tensor> unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& like) {
  TORCH_CHECK(flat.dim() == 1, "unflatten: expected a 1-D buffer, got ", flat.dim(), " dims");
  int64_t total = 0;
  for (const auto& t : like) total += t.numel();
  TORCH_CHECK(total == flat.numel(), "unflatten: buffer has ", flat.numel(),
              " elements, the tensors need ", total);
  std::vector<at::Tensor> out;
  out.reserve(like.size());
  int64_t offset = 0;
  for (const auto& t : like) {
    out.push_back(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "apex_C (p40fleet lab stand-in): flatten/unflatten of tensor lists";
  m.def("flatten", &flatten, "Flatten a list of tensors into one contiguous 1-D tensor");
  m.def("unflatten", &unflatten, "Split a 1-D tensor into views shaped like the given tensors");
}
