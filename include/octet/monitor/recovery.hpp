// octet/monitor/recovery.hpp: what to do when a check trips, done through the user's callbacks,
// and a log of every intervention with its cost.
//
//   octet::recovery_callbacks cb;
//   cb.raise_precision   = [&](const std::string& op, int steps) { hp_ops.insert(op); return extra_bytes; };
//   cb.restore_precision = [&](const std::string& op) { hp_ops.erase(op); };
//   cb.repeat_step       = [&](std::int64_t step) { state = before_step; run_step(step); return snapshot_bytes; };
//   cb.reload_checkpoint = [&] { state = load(ckpt); return octet::reload_result{ckpt.step, ckpt_bytes}; };
//   octet::recovery_policy policy(octet::recovery_config{}, cb);
//
//   for (std::int64_t step = 0; step < steps;) {
//       before_step = state;                         // what repeat_step restores
//       double secs = timed(run_step, step);        // feeds the check registry
//       auto o = policy.after_step(step, registry, secs);
//       if (o.stop) break;
//       step = o.next_step;
//   }
//   policy.log().to_markdown();
//
// The policy: each check has an escalation ladder (config.ladder; config.non_finite_ladder for
// check_kind::non_finite). A check's first trip takes the first action; a trip of the same check
// within config.escalation_window steps of its previous action (or at an earlier step, after a
// reload) takes the next one; past the end of the ladder its last action repeats while it is
// reload_checkpoint and reloads remain, else the run gives up. Several checks tripping at once
// take the most severe of their actions (raise < repeat < reload < give up); only the checks
// whose own action was that one move up their ladder (a check that would have raised when a
// repeat won keeps its level: its action was not taken).
//   * raise_precision: raise_precision(op, K) for each tripped check's operation; the step's
//     result stands; the operation runs in higher precision for the next K steps, then
//     restore_precision(op). A check with no operation, or whose operation is already raised,
//     moves on to the next action of its ladder.
//   * repeat_step: repeat_step(step) must restore the state from before the step and run it
//     again (feeding the registry, whose new samples are a new attempt). If the step still
//     trips after config.max_repeats repeats, the policy reloads (or gives up).
//   * reload_checkpoint: first every active raise ends (restore_precision(op), on the state that
//     raised it), then reload_checkpoint() restores the last checkpoint and returns its step c;
//     the run continues at c + 1 and steps up to the highest step reached are replays. The
//     checkpoint must hold a step before the failing one (c < step). The policy cannot know c
//     before the callback has reloaded, so a c >= step is reported after the fact: the reload
//     is logged (the user's state did change), and after_step throws octet::error saying that
//     the state now holds step c; the run cannot continue from that policy.
//   * give_up: after config.max_reloads reloads; after_step returns stop = true.
//
// Cost accounting (each log entry's `seconds` and `bytes`): the measured time of the callback
// (through config.clock), plus for raise_precision the extra time of each raised step over the
// median of the last 15 clean steps (split evenly among the raises active on that step), and
// for reload_checkpoint the time of every replayed step. `bytes` is what the callback returns
// (the extra memory the action held: a high-precision copy, a snapshot, a checkpoint buffer).
// Callbacks may throw; the exception propagates to the caller of after_step. An action whose
// callback threw is not logged and does not count: its checks keep their escalation level (their
// next trip takes the same action again). Actions completed before it in the same call stay
// logged and in effect.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "octet/core/check.hpp"
#include "octet/monitor/checks.hpp"

namespace octet {

enum class recovery_action : int { none = 0, raise_precision = 1, repeat_step = 2, reload_checkpoint = 3, give_up = 4 };

inline const char* recovery_action_name(recovery_action a) {
    switch (a) {
        case recovery_action::none:
            return "none";
        case recovery_action::raise_precision:
            return "raise_precision";
        case recovery_action::repeat_step:
            return "repeat_step";
        case recovery_action::reload_checkpoint:
            return "reload_checkpoint";
        case recovery_action::give_up:
            return "give_up";
    }
    return "unknown";
}

struct reload_result {
    std::int64_t checkpoint_step = -1;  ///< the step whose completed state the checkpoint holds (-1: the initial state)
    double bytes = 0;                   ///< extra memory the reload held
};

struct recovery_callbacks {
    std::function<double(const std::string& operation, int steps)> raise_precision;  ///< returns extra bytes
    std::function<void(const std::string& operation)> restore_precision;
    std::function<double(std::int64_t step)>
        repeat_step;  ///< restore the pre-step state, run the step again; returns extra bytes
    std::function<reload_result()> reload_checkpoint;
};

struct recovery_config {
    int raise_steps = 50;         ///< K: steps an operation stays in higher precision
    int max_repeats = 1;          ///< repeats of one step before escalating
    int max_reloads = 3;          ///< reloads in the whole run before giving up
    int escalation_window = 100;  ///< steps within which a check's next trip escalates
    std::vector<recovery_action> ladder{recovery_action::raise_precision, recovery_action::repeat_step,
                                        recovery_action::reload_checkpoint};
    std::vector<recovery_action> non_finite_ladder{recovery_action::repeat_step, recovery_action::reload_checkpoint};
    std::function<double()> clock;  ///< seconds; default std::chrono::steady_clock (tests inject their own)
};

struct recovery_entry {
    std::int64_t step = 0;  ///< the step at which the check(s) tripped
    recovery_action action = recovery_action::none;
    std::string reason;            ///< which checks, their values and limits
    std::string operation;         ///< raise_precision: the operation raised
    int steps = 0;                 ///< raise_precision: K; reload_checkpoint: steps to replay
    std::int64_t resume_step = 0;  ///< the step the run continues with
    double seconds = 0;            ///< extra time (see the header comment)
    double bytes = 0;              ///< extra memory (from the callback)
    double callback_seconds = 0;   ///< the part of `seconds` spent inside the callback itself
};

class recovery_log {
public:
    const std::vector<recovery_entry>& entries() const { return entries_; }
    std::size_t size() const { return entries_.size(); }
    std::size_t count(recovery_action a) const {
        return static_cast<std::size_t>(
            std::count_if(entries_.begin(), entries_.end(), [&](const recovery_entry& e) { return e.action == a; }));
    }
    /// Reloads of a checkpoint (the run restarted from saved state).
    std::size_t restarts() const { return count(recovery_action::reload_checkpoint); }
    /// All interventions except giving up.
    std::size_t recoveries() const { return entries_.size() - count(recovery_action::give_up); }
    bool gave_up() const { return count(recovery_action::give_up) > 0; }
    double seconds() const {
        double s = 0;
        for (const auto& e : entries_) s += e.seconds;
        return s;
    }
    double max_bytes() const {
        double b = 0;
        for (const auto& e : entries_) b = std::max(b, e.bytes);
        return b;
    }

    std::string to_markdown() const {
        std::ostringstream os;
        os << "| step | action | reason | operation | steps | resume at | extra time (ms) | extra memory (MiB) |\n"
              "|---|---|---|---|---|---|---|---|\n";
        for (const auto& e : entries_)
            os << "| " << e.step << " | " << recovery_action_name(e.action) << " | " << detail::md_cell(e.reason)
               << " | " << detail::md_cell(e.operation) << " | " << e.steps << " | " << e.resume_step << " | "
               << 1e3 * e.seconds << " | " << e.bytes / 1048576.0 << " |\n";
        return os.str();
    }
    std::string to_json() const {
        std::ostringstream os;
        os << "[";
        for (std::size_t i = 0; i < entries_.size(); ++i) {
            const auto& e = entries_[i];
            os << (i ? ", " : "") << "{\"step\": " << e.step << ", \"action\": \"" << recovery_action_name(e.action)
               << "\", \"reason\": " << detail::json_string(e.reason)
               << ", \"operation\": " << detail::json_string(e.operation) << ", \"steps\": " << e.steps
               << ", \"resume_step\": " << e.resume_step << ", \"seconds\": " << detail::json_number(e.seconds)
               << ", \"bytes\": " << detail::json_number(e.bytes) << "}";
        }
        os << "]";
        return os.str();
    }

private:
    friend class recovery_policy;
    std::vector<recovery_entry> entries_;
};

/// What after_step decided.
struct step_outcome {
    bool stop = false;                               ///< the policy gave up: end the run
    std::int64_t next_step = 0;                      ///< the step to run next
    recovery_action action = recovery_action::none;  ///< the most severe action taken at this step
};

class recovery_policy {
public:
    recovery_policy(recovery_config cfg, recovery_callbacks cb) : cfg_(std::move(cfg)), cb_(std::move(cb)) {
        constexpr const char* fn = "octet::recovery_policy";
        OCTET_REQUIRE(cfg_.raise_steps >= 1, fn, "cfg.raise_steps",
                      detail::message("is ", cfg_.raise_steps, "; pass K >= 1"));
        OCTET_REQUIRE(cfg_.max_repeats >= 1, fn, "cfg.max_repeats", "must be at least 1");
        OCTET_REQUIRE(cfg_.max_reloads >= 0, fn, "cfg.max_reloads", "must be non-negative");
        OCTET_REQUIRE(cfg_.escalation_window >= 0, fn, "cfg.escalation_window", "must be non-negative");
        for (const auto* ladder : {&cfg_.ladder, &cfg_.non_finite_ladder}) {
            OCTET_REQUIRE(!ladder->empty(), fn, "cfg.ladder",
                          "is empty; list at least one action (give_up ends the run)");
            for (recovery_action a : *ladder) {
                OCTET_REQUIRE(a != recovery_action::none, fn, "cfg.ladder",
                              "contains recovery_action::none; list actions to take");
                if (a == recovery_action::raise_precision)
                    OCTET_REQUIRE(cb_.raise_precision && cb_.restore_precision, fn, "cb.raise_precision",
                                  "and cb.restore_precision must both be set when a ladder raises precision");
                if (a == recovery_action::repeat_step)
                    OCTET_REQUIRE(cb_.repeat_step, fn, "cb.repeat_step", "must be set when a ladder repeats steps");
                if (a == recovery_action::reload_checkpoint || a == recovery_action::repeat_step)
                    OCTET_REQUIRE(cb_.reload_checkpoint || cfg_.max_reloads == 0, fn, "cb.reload_checkpoint",
                                  "must be set when a ladder can reload (repeat escalates to reload); or set "
                                  "cfg.max_reloads = 0");
            }
        }
        if (!cfg_.clock)
            cfg_.clock = [] {
                return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
            };
    }

    const recovery_log& log() const { return log_; }
    const recovery_config& config() const { return cfg_; }
    /// True while `operation` runs in raised precision.
    bool raised(const std::string& operation) const { return raised_.count(operation) != 0; }
    /// Steps executed again after reloads.
    std::int64_t replayed_steps() const { return replayed_steps_; }

    /// Call once after every executed step (first runs and replays) with its wall time. Reads the
    /// registry's samples for `step`, takes the action the ladder says, and returns where to go.
    step_outcome after_step(std::int64_t step, const check_registry& reg, double step_seconds) {
        OCTET_REQUIRE(step_seconds >= 0, "octet::recovery_policy::after_step", "step_seconds", "must be non-negative");
        attribute(step, step_seconds);
        std::vector<check_registry::check_id> trips = reg.tripped(step);
        if (trips.empty()) {
            finish_step();
            return step_outcome{false, step + 1, recovery_action::none};
        }
        // Decide each tripped check's action (and the ladder level it stands for); the most
        // severe one wins. Levels are committed only for the checks whose action was taken.
        recovery_action action = recovery_action::none;
        std::vector<decision> decided;
        for (auto id : trips) {
            const decision d = choose(id, step, reg);
            decided.push_back(d);
            action = std::max(action, d.action);
        }
        const std::string why = reason(reg, trips, step);
        const auto commit_levels = [&](recovery_action taken) {
            for (const auto& d : decided)
                if (d.action == taken) last_action_[d.id] = level_state{step, d.level};
        };

        if (action == recovery_action::raise_precision) {
            finish_step();  // the step stands: it counts for the operations raised before it
            for (const auto& d : decided) {
                const std::string& op = reg.spec(d.id).operation;
                if (raised(op)) {  // raised a moment ago for another check of this step: covered
                    if (raised_[op].step == step) last_action_[d.id] = level_state{step, d.level};
                    continue;
                }
                const double t0 = cfg_.clock();
                const double bytes = cb_.raise_precision(op, cfg_.raise_steps);  // may throw: nothing recorded for it
                const double dt = cfg_.clock() - t0;
                raised_[op] = raise_state{cfg_.raise_steps, log_.entries_.size(), step};
                log_.entries_.push_back(
                    recovery_entry{step, action, why, op, cfg_.raise_steps, step + 1, dt, bytes, dt});
                last_action_[d.id] = level_state{step, d.level};
            }
            return step_outcome{false, step + 1, action};  // the K raised steps start with the next one
        }
        if (action == recovery_action::give_up) {
            commit_levels(action);
            return give_up(step, why + " (no action left in the ladder)");
        }
        if (action == recovery_action::reload_checkpoint) {
            const step_outcome o = reload_or_give_up(step, why);
            commit_levels(action);
            return o;
        }
        {  // repeat_step
            std::string still = why;
            for (int r = 0; r < cfg_.max_repeats; ++r) {
                const double t0 = cfg_.clock();
                const double bytes = cb_.repeat_step(step);  // may throw
                const double dt = cfg_.clock() - t0;
                log_.entries_.push_back(
                    recovery_entry{step, recovery_action::repeat_step, still, "", 1, step + 1, dt, bytes, dt});
                if (r == 0) commit_levels(action);
                const auto again = reg.tripped(step);
                if (again.empty()) {
                    finish_step();
                    return step_outcome{false, step + 1, action};
                }
                still = reason(reg, again, step) + " (after repeat " + std::to_string(r + 1) + ")";
            }
            // Still failing: reload if allowed.
            return reload_or_give_up(step, still);
        }
    }

private:
    struct raise_state {
        int remaining;
        std::size_t entry;
        std::int64_t step;  ///< the step whose trip raised it
    };
    struct decision {
        check_registry::check_id id;
        recovery_action action;
        std::size_t level;  ///< the ladder level the action stands for
    };

    const std::vector<recovery_action>& ladder_of(check_kind k) const {
        return k == check_kind::non_finite ? cfg_.non_finite_ladder : cfg_.ladder;
    }

    decision choose(check_registry::check_id id, std::int64_t step, const check_registry& reg) const {
        const auto& ladder = ladder_of(reg.spec(id).kind);
        std::size_t level = 0;
        const auto it = last_action_.find(id);
        if (it != last_action_.end() && (step < it->second.step || step - it->second.step <= cfg_.escalation_window))
            level = it->second.level + 1;
        const std::string& op = reg.spec(id).operation;
        for (;; ++level) {
            recovery_action a;
            if (level < ladder.size())
                a = ladder[level];
            else
                a = ladder.back() == recovery_action::reload_checkpoint ? recovery_action::reload_checkpoint
                                                                        : recovery_action::give_up;
            if (a == recovery_action::raise_precision && (op.empty() || raised(op)))
                continue;                   // nothing (more) to raise
            return decision{id, a, level};  // a reload with no reloads left gives up in reload_or_give_up
        }
    }

    static std::string reason(const check_registry& reg, const std::vector<check_registry::check_id>& ids,
                              std::int64_t step) {
        std::string s;
        for (auto id : ids) {
            const check_sample* smp = reg.latest(id, step);
            if (!s.empty()) s += "; ";
            s += reg.describe(id, *smp);
        }
        return s;
    }

    step_outcome reload_or_give_up(std::int64_t step, const std::string& why) {
        if (reloads_ >= cfg_.max_reloads) return give_up(step, why + " (reloads exhausted)");
        // Raises belong to the state being abandoned: end them on that state, before it is replaced.
        for (auto it = raised_.begin(); it != raised_.end();) {
            cb_.restore_precision(it->first);
            it = raised_.erase(it);
        }
        const double t0 = cfg_.clock();
        const reload_result r = cb_.reload_checkpoint();
        const double dt = cfg_.clock() - t0;
        reloads_ += 1;
        if (r.checkpoint_step >= step) {  // the state has been reloaded already: log it, then say so
            log_.entries_.push_back(
                recovery_entry{step, recovery_action::reload_checkpoint,
                               why + detail::message(" (invalid: the checkpoint holds step ", r.checkpoint_step, ")"),
                               "", 0, r.checkpoint_step + 1, dt, r.bytes, dt});
            throw error(detail::message(
                "octet::recovery_policy: callback 'reload_checkpoint' returned checkpoint step ", r.checkpoint_step,
                " at failing step ", step, "; the state has been reloaded and now holds step ", r.checkpoint_step,
                ", which is not before the failing step, so the failure cannot be undone (the reload is logged). "
                "Save checkpoints only of steps that passed their checks"));
        }
        const int lost = static_cast<int>(step - r.checkpoint_step);
        reload_entry_ = log_.entries_.size();
        log_.entries_.push_back(recovery_entry{step, recovery_action::reload_checkpoint, why, "", lost,
                                               r.checkpoint_step + 1, dt, r.bytes, dt});
        replay_until_ = std::max(replay_until_, step);
        return step_outcome{false, r.checkpoint_step + 1, recovery_action::reload_checkpoint};
    }

    step_outcome give_up(std::int64_t step, const std::string& why) {
        log_.entries_.push_back(recovery_entry{step, recovery_action::give_up, why, "", 0, step, 0.0, 0.0, 0.0});
        return step_outcome{true, step, recovery_action::give_up};
    }

    /// Attributes a step's time: to the last reload while replaying, to the active raises for
    /// the part above the clean-step baseline, else to the baseline.
    void attribute(std::int64_t step, double seconds) {
        if (step <= replay_until_ && reload_entry_ < log_.entries_.size()) {
            log_.entries_[reload_entry_].seconds += seconds;
            replayed_steps_ += 1;
            return;
        }
        if (!raised_.empty()) {
            if (!clean_.empty()) {
                std::vector<double> sorted(clean_.begin(), clean_.end());
                std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(sorted.size() / 2),
                                 sorted.end());
                const double extra =
                    std::max(0.0, seconds - sorted[sorted.size() / 2]) / static_cast<double>(raised_.size());
                for (auto& [op, st] : raised_) log_.entries_[st.entry].seconds += extra;
            }
            return;
        }
        clean_.push_back(seconds);
        if (clean_.size() > 15) clean_.erase(clean_.begin());
    }

    /// Counts a completed step against the raised operations; restores those whose K steps are done.
    void finish_step() {
        for (auto it = raised_.begin(); it != raised_.end();) {
            if (--it->second.remaining == 0) {
                cb_.restore_precision(it->first);
                it = raised_.erase(it);
            } else {
                ++it;
            }
        }
    }

    struct level_state {
        std::int64_t step;
        std::size_t level;
    };

    recovery_config cfg_;
    recovery_callbacks cb_;
    recovery_log log_;
    std::map<std::string, raise_state> raised_;
    std::map<check_registry::check_id, level_state> last_action_;
    std::vector<double> clean_;
    int reloads_ = 0;
    std::int64_t replay_until_ = -1;
    std::size_t reload_entry_ = static_cast<std::size_t>(-1);
    std::int64_t replayed_steps_ = 0;
};

}  // namespace octet
