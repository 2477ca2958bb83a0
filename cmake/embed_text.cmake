# cmake -DIN=FILE -DOUT=FILE.cpp -DFUNCTION=name -DHEADER=path -P embed_text.cmake
# Writes a source file whose function returns FILE's text (a raw string literal), so that a
# program serves the file with nothing installed beside it.
file(READ ${IN} content)
string(FIND "${content}" ")SAEEMBED\"" clash)
if(NOT clash EQUAL -1)
    message(FATAL_ERROR "${IN} holds the raw string's closing delimiter )SAEEMBED\"")
endif()
file(WRITE ${OUT}.tmp "// Generated from ${IN} by cmake/embed_text.cmake: edit that file.
#include \"${HEADER}\"

namespace saetrain::serve {

const std::string& ${FUNCTION}() {
    static const std::string text = R\"SAEEMBED(${content})SAEEMBED\";
    return text;
}

}  // namespace saetrain::serve
")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
file(REMOVE ${OUT}.tmp)
