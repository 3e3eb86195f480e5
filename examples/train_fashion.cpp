// train_fashion: trains a reference model on Fashion-MNIST with kiln's
// Trainer (examples/fashion_app.h), on the GPU when there is one, else the CPU.
//
// With no arguments, the main job: FashionCNN for 4 epochs of AdamW + OneCycle
// (peak lr 3e-3), random horizontal flips, label smoothing 0.1 and test-time
// flip augmentation: 92.0% test accuracy or more in under a minute on 2 CPU
// cores (issue 25; bench/time_to_accuracy.py measures it). The flips pay
// because Fashion-MNIST's classes are mirror-symmetric; random crops (the
// default of the other binaries, --augment crop+flip) slow the first epochs.
#include "examples/fashion_app.h"

int main(int argc, char** argv) {
  kiln::examples::FashionDefaults defaults;
  defaults.max_epochs = 4;
  defaults.augment = "flip";
  defaults.label_smoothing = 0.1;
  defaults.tta = true;
  return kiln::examples::fashion_main(argc, argv, defaults);
}
