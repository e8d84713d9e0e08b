// ops/dispatch: helpers every op entry point uses to check its arguments and pick a device.
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace proplab::ops {

// Throws UserError "op '<op>' has no <device> implementation in this build" (never a silent fallback).
[[noreturn]] void missing_device_impl(const char* op, Device device);

// The common device of the given defined tensors; an InternalError naming the op if they disagree.
Device common_device(const char* op, std::initializer_list<const Tensor*> tensors);

// InternalError naming the op unless t is a defined, contiguous tensor of dtype `dtype` and shape `shape`.
void expect_shape(const char* op, const char* what, const Tensor& t, const Shape& shape, DType dtype = DType::f32);

}  // namespace proplab::ops
