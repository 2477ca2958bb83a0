// page.h — the live page sae-serve serves at `/`: src/serve/page.html (HTML, CSS and script in
// one file: no CDN, no external font), compiled into the program at build time.
#pragma once

#include <string>

namespace saetrain::serve {

const std::string& page_html();

}  // namespace saetrain::serve
