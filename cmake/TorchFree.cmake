# specula_check_torch_free(<target>...): configuration fails if one of the targets links LibTorch,
# directly or through any library it links. The router and the load generator are torch-free by
# design (docs/ARCHITECTURE.md); this keeps them so. Call it once every target exists (DEFER).
include(${CMAKE_CURRENT_LIST_DIR}/LinksTorch.cmake)

function(specula_check_torch_free)
  foreach(root IN LISTS ARGN)
    specula_links_torch(${root} links)
    if(links)
      message(FATAL_ERROR "${root} must not link LibTorch, but links it (directly or through a library)")
    endif()
  endforeach()
endfunction()
