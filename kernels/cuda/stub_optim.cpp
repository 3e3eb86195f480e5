// Linked when kiln is built without CUDA: the CUDA optimizer kernels throw.
#include "kernels/error.h"
#include "kernels/optim.h"

namespace kiln::kernels {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  KILN_THROW(what, ": kiln was built without CUDA (no CUDA toolkit was found at configure time)");
}
}  // namespace

void optim_step_prologue_cuda(int64_t*, int64_t* const*, int64_t, const float*, cuda::Stream) {
  no_cuda("optim_step_prologue");
}
void sgd_step_cuda(DType, const OptimTensor*, int64_t, const OptimScalars&, const SgdConfig&, cuda::Stream) {
  no_cuda("sgd");
}
void adam_step_cuda(DType, const OptimTensor*, int64_t, const OptimScalars&, const AdamConfig&, cuda::Stream) {
  no_cuda("adam");
}
void lamb_step_cuda(DType, const OptimTensor*, int64_t, const OptimScalars&, const LambConfig&, double*,
                    cuda::Stream) {
  no_cuda("lamb");
}
void lars_step_cuda(DType, const OptimTensor*, int64_t, const OptimScalars&, const LarsConfig&, double*,
                    cuda::Stream) {
  no_cuda("lars");
}
void grad_scaler_unscale_cuda(DType, const ListTensor*, int64_t, const float*, float*, cuda::Stream) {
  no_cuda("grad_scaler_unscale");
}
void grad_scaler_update_cuda(float*, int32_t*, const float* const*, int, double, double, int64_t, cuda::Stream) {
  no_cuda("grad_scaler_update");
}
void grad_norm_partials_cuda(DType, const ListTensor*, int64_t, double, double*, cuda::Stream) {
  no_cuda("grad_norm");
}
void grad_norm_finish_cuda(const double*, int64_t, double, double, float*, float*, cuda::Stream) {
  no_cuda("grad_norm");
}
void grad_scale_cuda(DType, const ListTensor*, int64_t, const float*, cuda::Stream) { no_cuda("grad_scale"); }
void grad_clamp_cuda(DType, const ListTensor*, int64_t, double, cuda::Stream) { no_cuda("clip_grad_value"); }
void average_update_cuda(DType, const ListTensor*, const ListTensor*, int64_t, const AverageConfig&, const float*,
                         cuda::Stream) {
  no_cuda("average_update");
}
void schedule_step_cuda(const ScheduleProgram&, int64_t*, const float*, bool, double* const*, double* const*,
                        const double* const*, cuda::Stream) {
  no_cuda("lr_schedule_step");
}

}  // namespace kiln::kernels
