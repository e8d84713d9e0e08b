#include "ops/dispatch.h"

#include <string>

namespace proplab::ops {

void missing_device_impl(const char* op, Device device) {
  throw UserError(std::string("op '") + op + "' has no " + device_name(device) + " implementation in this build");
}

Device common_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  bool have = false;
  Device device = Device::cpu;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (!have) {
      device = t->device();
      have = true;
    }
    PROPLAB_CHECK(t->device() == device, "op '", op, "' got tensors on different devices");
  }
  return device;
}

void expect_shape(const char* op, const char* what, const Tensor& t, const Shape& shape, DType dtype) {
  PROPLAB_CHECK(t.defined(), "op '", op, "': ", what, " is undefined");
  PROPLAB_CHECK(t.shape() == shape, "op '", op, "': ", what, " has shape ", shape_string(t.shape()), ", expected ",
                shape_string(shape));
  PROPLAB_CHECK(t.dtype() == dtype, "op '", op, "': ", what, " has dtype ", dtype_name(t.dtype()), ", expected ",
                dtype_name(dtype));
  PROPLAB_CHECK(t.is_contiguous(), "op '", op, "': ", what, " must be contiguous");
}

}  // namespace proplab::ops
