// The tiny ResNet the GUI and report tests train with `proplab run`: depth 14 (2 basic blocks per stage, so blocks
// 0..5 with transitions at blocks 2 and 4) on 8x8 synthetic images, 2 steps; it takes well under a second.
#pragma once

namespace proplab::gui_test {

inline constexpr const char* kTinyResnetStudy = R"(name = "stages"
seed = 2

[model]
type = "resnet"
depth = 14
width = 1
image_size = 8
classes = 4

[data]
kind = "images"

[train]
optimizer = "sgd"
steps = 2
batch = 2
lr = 0.01

[record]
every = 1

[device]
type = "cpu"
threads = 1
)";

}  // namespace proplab::gui_test
