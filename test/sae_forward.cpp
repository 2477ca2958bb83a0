// sae_forward — saetrain's own reconstruction of some rows, for the interop tests: the SAE of
// a final.h5 (or checkpoint) loaded into a SaeTrainer on the CPU backend, and x_hat from the
// inference pass its held-out evaluation uses (SaeTrainer::reconstruct).
//
//   sae_forward SAE.h5 ROWS.f32 XHAT.f32
// ROWS.f32: float32 little-endian [rows, d_model], row-major, no header (numpy's tofile);
// XHAT.f32 the same shape. A transcoder's rows are its inputs x, and XHAT.f32 its y_hat.
// test/python/test_saelens_interop.py compares SAELens's and sparsify's decode(encode(x)) of the
// exports with it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "saetrain/backend.h"     // defines: make_cpu_backend
#include "saetrain/checkpoint.h"  // defines: sae_read_h5
#include "saetrain/comm.h"        // defines: make_self_comm
#include "saetrain/config.h"      // defines: config_parse, sweep_ids
#include "saetrain/error.h"
#include "saetrain/trainer.h"     // defines: SaeTrainer
#include "saetrain/trainer_io.h"  // defines: trainer_restore

using namespace saetrain;

int main(int argc, char** argv) {
    try {
        SAE_ENFORCE(argc == 4, "usage: sae_forward SAE.h5 ROWS.f32 XHAT.f32");
        SaeMeta meta;
        const SaeWeights w = sae_read_h5(argv[1], &meta);
        const Config cfg = config_parse(meta.config_yaml, {}, argv[1]);
        const std::vector<std::string> ids = sweep_ids(cfg, w.d_model);
        SaeConfig sae;
        bool found = false;
        for (size_t i = 0; i < ids.size(); ++i)
            if (ids[i] == meta.id) sae = cfg.sweep[i], found = true;
        SAE_ENFORCE(found, "{}: SAE id {} is not in its own config's sweep", argv[1], meta.id);
        // final.h5 holds the SAE of the raw activations (data.normalize folded in); a
        // checkpoint keeps the scale as a tensor, which restore() reads.
        if (!w.has("activation_scale")) sae.normalize = "none";
        std::ifstream in(argv[2], std::ios::binary);
        SAE_ENFORCE(in.good(), "cannot read {}", argv[2]);
        const std::string bytes((std::istreambuf_iterator<char>(in)), {});
        const auto row_bytes = static_cast<size_t>(w.d_model) * sizeof(float);
        SAE_ENFORCE(bytes.size() % row_bytes == 0, "{}: {} bytes is not a whole number of rows",
                    argv[2], bytes.size());
        const auto rows = static_cast<int64_t>(bytes.size() / row_bytes);
        std::vector<float> x(bytes.size() / sizeof(float)), x_hat(x.size());
        std::memcpy(x.data(), bytes.data(), bytes.size());

        auto be = make_cpu_backend(1);
        auto self = make_self_comm();
        SaeTrainer trainer(sae, w.d_model, 1, 0, *be, *self);
        TrainState st;
        const size_t n_params = trainer.params_host().size();
        st.opt_m.assign(n_params, 0.0f), st.opt_v.assign(n_params, 0.0f);
        st.since_fired.assign(static_cast<size_t>(w.n_latents), 0);
        trainer_restore(trainer, w, st);
        if (trainer.row_width() != w.d_model) {  // a transcoder reads [x | y]: y is not read
            std::vector<float> xy(static_cast<size_t>(rows * trainer.row_width()), 0.0f);
            for (int64_t r = 0; r < rows; ++r)
                std::copy_n(x.begin() + r * w.d_model, w.d_model,
                            xy.begin() + r * trainer.row_width());
            x.swap(xy);
        }
        trainer.reconstruct(x.data(), rows, 4096, x_hat.data());
        std::ofstream out(argv[3], std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(x_hat.data()),
                  static_cast<std::streamsize>(x_hat.size() * sizeof(float)));
        SAE_ENFORCE(out.good(), "cannot write {}", argv[3]);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "sae_forward: error: %s\n", e.what());
        return 1;
    }
}
