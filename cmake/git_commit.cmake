# SAETRAIN_GIT_COMMIT: the commit HEAD names at configure time (12 hex digits), "unknown" outside
# a git checkout. HEAD, the branch it points at and packed-refs become configure dependencies, so
# a commit or a checkout re-runs configure and --version stays true without a clean build.
set(SAETRAIN_GIT_COMMIT unknown)
find_package(Git QUIET)
if(GIT_FOUND)
    execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD
        WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} RESULT_VARIABLE _rc
        OUTPUT_VARIABLE _commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_rc EQUAL 0)
        set(SAETRAIN_GIT_COMMIT ${_commit})
        set(_refs HEAD packed-refs)
        execute_process(COMMAND ${GIT_EXECUTABLE} symbolic-ref -q HEAD
            WORKING_DIRECTORY ${PROJECT_SOURCE_DIR} RESULT_VARIABLE _rc
            OUTPUT_VARIABLE _branch OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
        if(_rc EQUAL 0)
            list(APPEND _refs ${_branch})
        endif()
        foreach(_ref IN LISTS _refs)
            # --git-path: the file's path in this worktree's git directory (or the common one)
            execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --git-path ${_ref}
                WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                OUTPUT_VARIABLE _path OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
            get_filename_component(_path "${_path}" ABSOLUTE BASE_DIR ${PROJECT_SOURCE_DIR})
            if(EXISTS "${_path}")
                set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY
                    CMAKE_CONFIGURE_DEPENDS "${_path}")
            endif()
        endforeach()
    endif()
endif()
