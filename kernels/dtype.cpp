#include "kernels/dtype.h"

namespace kiln {

DType parse_dtype(std::string_view name) {
  if (name == "float32" || name == "f32" || name == "fp32" || name == "float") return DType::f32;
  if (name == "float64" || name == "f64" || name == "fp64" || name == "double") return DType::f64;
  if (name == "float16" || name == "f16" || name == "fp16" || name == "half") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "int32" || name == "i32") return DType::i32;
  if (name == "int64" || name == "i64" || name == "long") return DType::i64;
  if (name == "uint8" || name == "u8") return DType::u8;
  if (name == "bool" || name == "b8") return DType::b8;
  KILN_THROW("parse_dtype: unknown dtype '", name,
             "' (expected float32, float64, float16, bfloat16, int32, int64, uint8 or bool)");
}

}  // namespace kiln
