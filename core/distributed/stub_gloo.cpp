// Linked instead of gloo_backend.cpp when CMake found no Gloo package
// (libgloo-dev): CPU collectives then throw a clear kiln::Error.
#include "core/distributed/process_group.h"
#include "kernels/error.h"

namespace kiln::distributed {

std::unique_ptr<Backend> make_gloo_backend(TCPStore&, const std::string&, int, int, std::chrono::milliseconds,
                                           const std::string&) {
  KILN_THROW("ProcessGroup: kiln was built without Gloo (install libgloo-dev and reconfigure); CPU collectives "
             "and barriers need it");
}

}  // namespace kiln::distributed
