// examples/08_training/evaluator.hpp: a training run's held-out loss. The windows are fixed for
// every run (drawn with one seed from the corpus's held-out tail), so that recipes and seeds are
// compared on the same text; the model evaluates them in batches of at most the ranks' batch.
#pragma once

#include "common/corpus.hpp"
#include "common/model.hpp"
#include "train.hpp"

#include <octet/octet.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace train {

class evaluator {
public:
    /// `sequences` windows of mc.seq_len + 1 tokens, evaluated `max_batch` at a time.
    evaluator(memory_meter& meter, const corpus& data, const model_config& mc, int sequences, int max_batch)
        : seq_len_(mc.seq_len),
          sequences_(sequences),
          batch_(std::min(sequences, max_batch)),
          tokens_(make_metered<std::int32_t>(meter, octet::memory_category::temporaries,
                                             static_cast<std::size_t>(sequences) * (mc.seq_len + 1))) {
        sample_batch(data.heldout, mc.seq_len, sequences, 777, 0, 0, tokens_.data());
    }

    /// The mean loss per character (nats) of `model` with `params` over the windows.
    double operator()(transformer& model, const weights_ref& params) const {
        double sum = 0;
        int seen = 0;
        for (int b = 0; b < sequences_; b += batch_) {
            const int nb = std::min(batch_, sequences_ - b);
            sum += model.evaluate(params, tokens_.data() + static_cast<std::size_t>(b) * (seq_len_ + 1), nb) * nb;
            seen += nb;
        }
        return sum / seen;
    }

private:
    int seq_len_, sequences_, batch_;
    metered_vector<std::int32_t> tokens_;
};

}  // namespace train
