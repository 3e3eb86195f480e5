// train_fashion: trains a reference model on Fashion-MNIST with kiln's
// Trainer (examples/fashion_app.h). With no arguments: FashionCNN, AdamW +
// OneCycle, normalization and light augmentation, on the GPU when there is
// one, else the CPU.
#include "examples/fashion_app.h"

int main(int argc, char** argv) { return kiln::examples::fashion_main(argc, argv, {}); }
