// met-logits: llama.cpp's logits for one teacher-forced token sequence, as the oracle of Metrale's
// GGUF path (issue 31). Built by scripts/build-llamacpp.sh against the libllama of the same build.
//
// Usage: met-logits MODEL.gguf TOKENS.i32 OUT.f32 [N_THREADS]
//   TOKENS.i32: the token ids, little-endian int32, one sequence (positions 0..n-1).
//   OUT.f32:    n x n_vocab float32 little-endian, row i = the logits after token i.
// Prints "n_tokens n_vocab" on stdout; exit status 0 on success, 1 on any failure (with a reason
// on stderr). llama.cpp's own log lines below warning level are dropped.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    if (level >= GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

static std::vector<llama_token> read_tokens(const char * path) {
    std::vector<llama_token> tokens;
    FILE * f = fopen(path, "rb");
    if (f == nullptr) {
        return tokens;
    }
    int32_t id = 0;
    while (fread(&id, sizeof(id), 1, f) == 1) {
        tokens.push_back(id);
    }
    fclose(f);
    return tokens;
}

int main(int argc, char ** argv) {
    if (argc < 4 || argc > 5) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKENS.i32 OUT.f32 [N_THREADS]\n", argv[0]);
        return 1;
    }
    const int n_threads = argc == 5 ? atoi(argv[4]) : 1;
    const std::vector<llama_token> tokens = read_tokens(argv[2]);
    if (tokens.empty()) {
        fprintf(stderr, "met-logits: no tokens read from %s\n", argv[2]);
        return 1;
    }
    const int32_t n = (int32_t) tokens.size();

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (model == nullptr) {
        fprintf(stderr, "met-logits: cannot load %s\n", argv[1]);
        return 1;
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) (n < 256 ? 256 : n);
    cparams.n_batch = (uint32_t) n;
    cparams.n_ubatch = (uint32_t) n;
    cparams.n_seq_max = 1;
    cparams.n_threads = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "met-logits: cannot create a context\n");
        llama_model_free(model);
        return 1;
    }

    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int32_t i = 0; i < n; ++i) {
        batch.token[i] = tokens[(size_t) i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    int status = 0;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "met-logits: llama_decode failed\n");
        status = 1;
    }

    FILE * out = status == 0 ? fopen(argv[3], "wb") : nullptr;
    if (status == 0 && out == nullptr) {
        fprintf(stderr, "met-logits: cannot write %s\n", argv[3]);
        status = 1;
    }
    for (int32_t i = 0; status == 0 && i < n; ++i) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (row == nullptr || fwrite(row, sizeof(float), (size_t) n_vocab, out) != (size_t) n_vocab) {
            fprintf(stderr, "met-logits: no logits for position %d\n", i);
            status = 1;
        }
    }
    if (out != nullptr && fclose(out) != 0) {
        status = 1;
    }
    if (status == 0) {
        printf("%d %d\n", n, n_vocab);
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return status;
}
