# `cmake --install build [--prefix P]`: headers under P/include/kiln, the
# static libraries under P/lib, and a CMake package so that a downstream
# project does find_package(kiln) and links kiln::kiln.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(kiln_installed_targets kiln kiln_trainer kiln_data kiln_optim kiln_nn kiln_core kiln_kernels)
install(TARGETS ${kiln_installed_targets} EXPORT kilnTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln)
foreach(folder kernels core nn optim data trainer)
  install(DIRECTORY ${CMAKE_SOURCE_DIR}/${folder}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/${folder}
    FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

set(KILN_WITH_GLOO OFF)
if(TARGET gloo)
  set(KILN_WITH_GLOO ON)
endif()
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/kilnConfig.cmake.in
  ${CMAKE_BINARY_DIR}/kilnConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/kilnConfig.cmake ${CMAKE_BINARY_DIR}/kilnConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)
