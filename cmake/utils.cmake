# SAETRAIN_FUZZ (clang only, test/fuzz): every target gets ASan and UBSan (UB aborts, so libFuzzer
# sees it) and libFuzzer's coverage instrumentation, so the fuzzers see and sanitize the library
# code they call. Link options are PUBLIC: a static library passes them to what links it.
function(saetrain_set_sanitizers target)
    if(NOT SAETRAIN_FUZZ)
        return()
    endif()
    set(_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    target_compile_options(${target} PRIVATE
        $<$<COMPILE_LANGUAGE:C,CXX>:${_san} -fsanitize=fuzzer-no-link -g>)
    target_link_options(${target} PUBLIC ${_san})
endfunction()

# Per-target warning flags; never global CMAKE_CXX_FLAGS.
function(saetrain_set_warnings target)
    set(_cxx -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
    if(SAETRAIN_WERROR)
        list(APPEND _cxx -Werror)
    endif()
    if(SAETRAIN_NATIVE)
        list(APPEND _cxx -march=native)
    endif()
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${_cxx}>)
    saetrain_set_sanitizers(${target})
    if(SAETRAIN_CUDA)
        set(_cu -Xcompiler=-Wall,-Wextra)
        if(SAETRAIN_WERROR)
            list(APPEND _cu -Werror=all-warnings -Xcompiler=-Werror)
        endif()
        target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${_cu}>)
    endif()
endfunction()

# One library per layer, each with a saetrain:: alias.
function(saetrain_add_library name)
    cmake_parse_arguments(A "" "" "SOURCES;PUBLIC;PRIVATE" ${ARGN})
    add_library(saetrain_${name} STATIC ${A_SOURCES})
    add_library(saetrain::${name} ALIAS saetrain_${name})
    target_include_directories(saetrain_${name} PUBLIC
        ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/generated)
    target_link_libraries(saetrain_${name} PUBLIC ${A_PUBLIC} PRIVATE ${A_PRIVATE})
    saetrain_set_warnings(saetrain_${name})
endfunction()

function(saetrain_add_app name)
    add_executable(${name} ${name}.cpp)
    target_link_libraries(${name} PRIVATE ${ARGN})
    saetrain_set_warnings(${name})
endfunction()
