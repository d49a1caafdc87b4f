// The recovery policy driven by scripted failures on a small fake training state (weights,
// optimizer moment, data cursor; low precision rounds the weights through bf16): it takes each
// action (raise precision for K steps, repeat the step, reload the last checkpoint, give up),
// the log and the run report account for the cost (through an injected clock, so the expected
// numbers are exact), and no action loses the state it was supposed to keep: the recovered run
// ends bit-identical to a clean run with the same precision schedule.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "octet/core/bits.hpp"
#include "octet/monitor/checks.hpp"
#include "octet/monitor/memory_ledger.hpp"
#include "octet/monitor/recovery.hpp"
#include "octet/monitor/run_report.hpp"

using namespace octet;

namespace {

struct fake_state {
    std::vector<double> w = std::vector<double>(64, 0.5), m = std::vector<double>(64, 0.0);
    std::int64_t completed = -1;    // the last completed step
    std::uint64_t data_cursor = 0;  // samples consumed
    bool operator==(const fake_state& o) const {
        return w == o.w && m == o.m && completed == o.completed && data_cursor == o.data_cursor;
    }
    double bytes() const { return static_cast<double>((w.size() + m.size()) * sizeof(double)); }
};

/// One deterministic optimizer step; low precision rounds the weights through bf16.
void train_step(fake_state& s, std::int64_t step, bool high_precision) {
    for (std::size_t i = 0; i < s.w.size(); ++i) {
        const double g = std::sin(0.5 * s.w[i] + 0.1 * static_cast<double>(step) + static_cast<double>(i));
        s.m[i] = 0.9 * s.m[i] + 0.1 * g;
        s.w[i] -= 0.01 * s.m[i];
        if (!high_precision) s.w[i] = to_float(to_bf16(static_cast<float>(s.w[i])));
    }
    s.completed = step;
    s.data_cursor += 32;
}

/// A scripted failure: check `name` reports `value` at `step` on the listed attempts (1-based).
struct failure {
    std::string name;
    std::int64_t step;
    std::set<int> attempts;
    double value;
};

/// The harness: a training loop with a fake clock, monitors fed from a failure script, the
/// user's callbacks, checkpoints every 5 steps, and the run report.
struct harness {
    double now = 0;
    fake_state state, before, checkpoint;
    std::set<std::string> raised_ops;
    std::vector<std::pair<std::int64_t, bool>> precision_of_step;  // (step, matmul high precision) per execution
    check_registry reg;
    std::vector<failure> script;
    std::map<std::int64_t, int> executions;
    memory_ledger ledger{{memory_category::weights, 512}, {memory_category::optimizer_state, 512}};
    run_report report;
    recovery_config cfg;
    std::vector<std::string> restored;

    harness() {
        reg.add("matmul.saturation", check_kind::saturation_rate, "matmul");
        reg.add("grad.non_finite", check_kind::non_finite, "backward");
        reg.add("loss.spike", check_kind::custom, threshold::above(5.0, 10.0));
        cfg.raise_steps = 3;
        cfg.clock = [this] { return now; };
    }

    /// Runs one step: 1.0 s, or 1.5 s with matmul raised; the monitors read the script.
    void run(std::int64_t step) {
        const int attempt = ++executions[step];
        const bool hp = raised_ops.count("matmul") != 0;
        const double t0 = now;
        train_step(state, step, hp);
        precision_of_step.emplace_back(step, hp);
        now += hp ? 1.5 : 1.0;
        for (std::size_t id = 0; id < reg.size(); ++id) {
            double v = 0;
            for (const auto& f : script)
                if (f.name == reg.spec(id).name && f.step == step && f.attempts.count(attempt)) v = f.value;
            reg.record(id, step, v, 0.001);
        }
        report.record_step(step, /*loss=*/1.0 / static_cast<double>(step + 1), /*tokens=*/1000, now - t0);
    }

    recovery_callbacks callbacks() {
        recovery_callbacks cb;
        cb.raise_precision = [this](const std::string& op, int) {
            raised_ops.insert(op);
            now += 0.01;
            ledger.allocate(memory_category::temporaries, 256);  // a high-precision copy
            return 256.0;
        };
        cb.restore_precision = [this](const std::string& op) {
            raised_ops.erase(op);
            restored.push_back(op);
            ledger.release(memory_category::temporaries, 256);
        };
        cb.repeat_step = [this](std::int64_t step) {
            state = before;  // the state from before the step
            now += 0.1;
            run(step);
            return before.bytes();
        };
        cb.reload_checkpoint = [this] {
            state = checkpoint;
            now += 2.0;
            return reload_result{checkpoint.completed, checkpoint.bytes()};
        };
        return cb;
    }

    /// The loop. Returns the log; checks the state right after every action.
    recovery_log train(std::int64_t steps, recovery_policy& policy) {
        for (std::int64_t step = 0; step < steps;) {
            before = state;
            const double t0 = now;
            run(step);
            const fake_state after_run = state;
            const step_outcome o = policy.after_step(step, reg, now - t0 - 0.0);
            // what each action must keep
            if (o.action == recovery_action::none || o.action == recovery_action::raise_precision) {
                CHECK(state == after_run);  // the step stands, untouched
            } else if (o.action == recovery_action::repeat_step) {
                fake_state want = before;  // the pre-step state plus one clean run of the step
                train_step(want, step, precision_of_step.back().second);
                CHECK(state == want);
            } else if (o.action == recovery_action::reload_checkpoint) {
                CHECK(state == checkpoint);  // exactly the checkpoint
                CHECK(o.next_step == checkpoint.completed + 1);
            }
            if (o.stop) break;
            if (o.next_step == step + 1 && step % 5 == 4) checkpoint = state;
            step = o.next_step;
        }
        return policy.log();
    }
};

/// The clean run: the same precision schedule (matmul raised on the listed steps), no failures.
fake_state clean_run(std::int64_t steps, const std::set<std::int64_t>& raised) {
    fake_state s;
    for (std::int64_t step = 0; step < steps; ++step) train_step(s, step, raised.count(step) != 0);
    return s;
}

}  // namespace

TEST_CASE("a scripted failure takes each action, accounts for its cost, and loses no state") {
    harness h;
    h.script = {
        {"matmul.saturation", 5, {1}, 0.01},  // saturation: raise matmul's precision for steps 6, 7, 8
        {"grad.non_finite", 12, {1}, 3.0},    // transient NaNs: repeat step 12, clean the second time
        {"loss.spike", 18, {1, 2}, 50.0}};    // persistent: repeat fails, reload the step-14 checkpoint, replay 15..18
    recovery_policy policy(h.cfg, h.callbacks());
    const recovery_log log = h.train(25, policy);

    REQUIRE(log.size() == 4);
    const auto& e = log.entries();
    CHECK(e[0].action == recovery_action::raise_precision);
    CHECK(e[0].step == 5);
    CHECK(e[0].operation == "matmul");
    CHECK(e[0].steps == 3);
    CHECK(e[0].reason.find("matmul.saturation") != std::string::npos);
    // extra time: the callback (0.01 s) + three raised steps at 1.5 s over the 1.0 s baseline
    CHECK(e[0].seconds == doctest::Approx(0.01 + 3 * 0.5));
    CHECK(e[0].bytes == 256);
    CHECK(e[1].action == recovery_action::repeat_step);
    CHECK(e[1].step == 12);
    CHECK(e[1].seconds == doctest::Approx(1.1));  // restore 0.1 s + the repeated step 1.0 s
    CHECK(e[1].bytes == fake_state().bytes());
    CHECK(e[2].action == recovery_action::repeat_step);
    CHECK(e[2].step == 18);
    CHECK(e[3].action == recovery_action::reload_checkpoint);
    CHECK(e[3].step == 18);
    CHECK(e[3].steps == 4);  // steps 15..18 replayed
    CHECK(e[3].resume_step == 15);
    CHECK(e[3].reason.find("after repeat 1") != std::string::npos);
    CHECK(e[3].seconds == doctest::Approx(2.0 + 4 * 1.0));  // the load + four replayed steps
    CHECK(e[3].callback_seconds == doctest::Approx(2.0));
    CHECK(policy.replayed_steps() == 4);
    CHECK(h.restored == std::vector<std::string>{"matmul"});
    CHECK_FALSE(policy.raised("matmul"));

    // matmul ran in high precision on exactly steps 6, 7, 8 (each executed once)
    std::set<std::int64_t> hp_steps;
    for (const auto& [step, hp] : h.precision_of_step)
        if (hp) hp_steps.insert(step);
    CHECK(hp_steps == std::set<std::int64_t>{6, 7, 8});
    // nothing lost: bit-identical to a clean run with the same precision schedule
    CHECK(h.state == clean_run(25, hp_steps));
    CHECK_FALSE(h.state == clean_run(25, {}));  // (and the precision schedule does matter)

    // the run report accounts for the same costs
    const run_summary s = h.report.summarize(h.reg, log, h.ledger);
    CHECK(s.executed_steps == 25 + 2 + 4);
    CHECK(s.distinct_steps == 25);
    CHECK(s.restarts == 1);
    CHECK(s.recoveries == 4);
    CHECK(s.raises == 1);
    CHECK(s.repeats == 2);
    CHECK_FALSE(s.gave_up);
    const double step_seconds = 25 * 1.0 + 3 * 0.5 + 2 * 1.0 + 4 * 1.0;
    CHECK(s.step_seconds == doctest::Approx(step_seconds));
    CHECK(s.wall_seconds == doctest::Approx(step_seconds + 0.01 + 2.0));  // + raise and reload callbacks
    CHECK(s.tokens_processed == 31000);
    CHECK(s.tokens_kept == 25000);
    CHECK(s.throughput == doctest::Approx(31000 / s.wall_seconds));
    CHECK(s.goodput == doctest::Approx(25000 / s.wall_seconds));
    CHECK(s.recovery_seconds == doctest::Approx(1.51 + 1.1 + 1.1 + 6.0));
    CHECK(s.recovery_max_bytes == fake_state().bytes());
    CHECK(s.peak_memory_bytes == 1024 + 256);
    CHECK(s.monitor_seconds == doctest::Approx(31 * 3 * 0.001));
    CHECK(s.monitor_overhead == doctest::Approx(31 * 3 * 0.001 / s.wall_seconds));
    CHECK(s.first_loss == 1.0);
    CHECK(s.final_loss == doctest::Approx(1.0 / 25));
    CHECK(s.min_loss == doctest::Approx(1.0 / 25));
    const std::string js = h.report.to_json(h.reg, log, h.ledger);
    CHECK(js.find("\"restarts\": 1") != std::string::npos);
    CHECK(js.find("\"action\": \"reload_checkpoint\"") != std::string::npos);
    CHECK(js.find("\"peak_total\": 1280") != std::string::npos);
    CHECK(std::count(js.begin(), js.end(), '{') == std::count(js.begin(), js.end(), '}'));
    CHECK(std::count(js.begin(), js.end(), '[') == std::count(js.begin(), js.end(), ']'));
    const std::string md = h.report.to_markdown(h.reg, log, h.ledger);
    CHECK(md.find("| restarts (checkpoint reloads) | 1 |") != std::string::npos);
    CHECK(md.find("| 18 | reload_checkpoint |") != std::string::npos);
    CHECK(md.find("| matmul.saturation | saturation_rate | matmul |") != std::string::npos);
    MESSAGE(md);
}

TEST_CASE("a failure that survives every action gives up after the allowed reloads") {
    harness h;
    h.cfg.max_reloads = 1;
    h.script = {{"grad.non_finite", 7, {1, 2, 3, 4, 5, 6}, 1.0}};  // NaNs at step 7 whatever happens
    recovery_policy policy(h.cfg, h.callbacks());
    const recovery_log log = h.train(20, policy);
    // step 7: repeat (fails) -> reload to step 4 -> replay 5, 6, 7 -> trips again -> reloads exhausted
    REQUIRE(log.size() >= 3);
    CHECK(log.entries()[0].action == recovery_action::repeat_step);
    CHECK(log.entries()[1].action == recovery_action::reload_checkpoint);
    CHECK(log.entries()[1].resume_step == 5);
    CHECK(log.entries().back().action == recovery_action::give_up);
    CHECK(log.entries().back().reason.find("reloads exhausted") != std::string::npos);
    CHECK(log.gave_up());
    CHECK(log.restarts() == 1);
    CHECK(h.state.completed == 7);  // stopped at the failing step
    const run_summary s = h.report.summarize(h.reg, log, h.ledger);
    CHECK(s.gave_up);
    CHECK(h.report.to_markdown(h.reg, log, h.ledger).find("gave up") != std::string::npos);
}

TEST_CASE("escalation: within the window the next action, after it the first again; most severe wins") {
    harness h;
    h.cfg.escalation_window = 10;
    h.cfg.raise_steps = 2;
    h.script = {{"matmul.saturation", 2, {1}, 0.01},   // raise (level 0)
                {"matmul.saturation", 6, {1}, 0.01},   // within 10 steps: level 1, repeat
                {"matmul.saturation", 30, {1}, 0.01},  // 24 steps later: level 0 again, raise
                {"matmul.saturation", 40, {1}, 0.01},  // with the non-finite check at once: repeat wins
                {"grad.non_finite", 40, {1}, 2.0}};
    recovery_policy policy(h.cfg, h.callbacks());
    const recovery_log log = h.train(45, policy);
    REQUIRE(log.size() == 4);
    CHECK(log.entries()[0].action == recovery_action::raise_precision);
    CHECK(log.entries()[1].action == recovery_action::repeat_step);
    CHECK(log.entries()[1].step == 6);
    CHECK(log.entries()[2].action == recovery_action::raise_precision);
    CHECK(log.entries()[2].step == 30);
    CHECK(log.entries()[3].action == recovery_action::repeat_step);
    CHECK(log.entries()[3].step == 40);
    CHECK(log.entries()[3].reason.find("matmul.saturation") != std::string::npos);
    CHECK(log.entries()[3].reason.find("grad.non_finite") != std::string::npos);
    CHECK(h.restored.size() == 2);  // both raises ran out after K = 2 steps
    std::set<std::int64_t> hp_steps;
    for (const auto& [step, hp] : h.precision_of_step)
        if (hp) hp_steps.insert(step);
    CHECK(hp_steps == std::set<std::int64_t>{3, 4, 31, 32});
    CHECK(h.state == clean_run(45, hp_steps));
}

TEST_CASE("recovery policy: configuration and callback errors") {
    recovery_callbacks none;
    CHECK_THROWS_WITH_AS(recovery_policy(recovery_config{}, none), doctest::Contains("argument 'cb.raise_precision'"),
                         octet::error);
    recovery_config c;
    c.ladder = {};
    harness h;
    CHECK_THROWS_WITH_AS(recovery_policy(c, h.callbacks()), doctest::Contains("argument 'cfg.ladder' is empty"),
                         octet::error);
    c = recovery_config{};
    c.raise_steps = 0;
    CHECK_THROWS_WITH_AS(recovery_policy(c, h.callbacks()), doctest::Contains("argument 'cfg.raise_steps'"),
                         octet::error);
    // a ladder without reload needs no reload callback when reloads are off
    recovery_callbacks only_repeat;
    only_repeat.repeat_step = [](std::int64_t) { return 0.0; };
    recovery_config r;
    r.ladder = {recovery_action::repeat_step, recovery_action::give_up};
    r.non_finite_ladder = {recovery_action::repeat_step};
    r.max_reloads = 0;
    CHECK_NOTHROW(recovery_policy(r, only_repeat));
    // a checkpoint must be older than the failing step
    recovery_callbacks bad = h.callbacks();
    bad.reload_checkpoint = [] { return reload_result{50, 0}; };
    check_registry reg;
    const auto id = reg.add("x", check_kind::custom, threshold::above(1, 2));
    recovery_config rc;
    rc.ladder = {recovery_action::reload_checkpoint};
    recovery_policy p(rc, bad);
    reg.record(id, 10, 5.0);
    CHECK_THROWS_WITH_AS(
        p.after_step(10, reg, 1.0),
        doctest::Contains("returned checkpoint step 50 at failing step 10; the state has been reloaded"), octet::error);
    CHECK_THROWS_WITH_AS(p.after_step(11, reg, -1.0), doctest::Contains("argument 'step_seconds'"), octet::error);
}

TEST_CASE("a ladder that runs out gives up and says so") {
    harness h;
    h.cfg.ladder = {recovery_action::raise_precision};
    h.cfg.raise_steps = 5;
    h.script = {{"matmul.saturation", 3, {1}, 0.01},
                {"matmul.saturation", 5, {1}, 0.01}};  // the second while still raised
    recovery_policy policy(h.cfg, h.callbacks());
    const recovery_log log = h.train(20, policy);
    REQUIRE(log.size() == 2);
    CHECK(log.entries()[0].action == recovery_action::raise_precision);
    CHECK(log.entries()[1].action == recovery_action::give_up);
    CHECK(log.entries()[1].step == 5);
    CHECK(log.entries()[1].reason.find("no action left in the ladder") != std::string::npos);
    CHECK(policy.raised("matmul"));  // giving up leaves the run as it is
}

TEST_CASE("a raise whose callback throws is not logged and does not use up the check's level") {
    harness h;
    h.script = {{"matmul.saturation", 5, {1}, 0.01}, {"matmul.saturation", 6, {1}, 0.01}};
    recovery_callbacks cb = h.callbacks();
    int calls = 0;
    cb.raise_precision = [&, inner = cb.raise_precision](const std::string& op, int k) {
        if (calls++ == 0) throw std::runtime_error("no memory for a high-precision copy");
        return inner(op, k);
    };
    recovery_policy policy(h.cfg, cb);
    for (std::int64_t step = 0; step < 5; ++step)
        CHECK(policy.after_step((h.run(step), step), h.reg, 1.0).action == recovery_action::none);
    h.run(5);
    CHECK_THROWS_WITH_AS(policy.after_step(5, h.reg, 1.0), "no memory for a high-precision copy", std::runtime_error);
    CHECK(policy.log().size() == 0);
    CHECK_FALSE(policy.raised("matmul"));
    // the next trip (within the window) takes the same first action again, not the second
    h.run(6);
    const step_outcome o = policy.after_step(6, h.reg, 1.0);
    CHECK(o.action == recovery_action::raise_precision);
    REQUIRE(policy.log().size() == 1);
    CHECK(policy.log().entries()[0].step == 6);
    CHECK(policy.raised("matmul"));
}

TEST_CASE("when a repeat wins over a raise, only the repeating check moves up its ladder") {
    harness h;
    h.script = {{"matmul.saturation", 3, {1}, 0.01},  // would raise ...
                {"grad.non_finite", 3, {1}, 2.0},  // ... but the repeat of the non-finite check wins (and cures both)
                {"matmul.saturation", 6, {1}, 0.01},  // saturation again: its first action, raise (not repeat)
                {"grad.non_finite", 7, {1}, 1.0}};    // the non-finite check's second trip: its second action, reload
    recovery_policy policy(h.cfg, h.callbacks());
    const recovery_log log = h.train(12, policy);
    REQUIRE(log.size() == 3);
    CHECK(log.entries()[0].action == recovery_action::repeat_step);
    CHECK(log.entries()[0].step == 3);
    CHECK(log.entries()[1].action == recovery_action::raise_precision);
    CHECK(log.entries()[1].step == 6);
    CHECK(log.entries()[2].action == recovery_action::reload_checkpoint);
    CHECK(log.entries()[2].step == 7);
    CHECK(log.entries()[2].resume_step == 5);
}

TEST_CASE("a reload ends the active raises first: the reloaded run never sees them") {
    harness h;
    std::vector<std::string> events;
    recovery_callbacks cb = h.callbacks();
    cb.restore_precision = [&, inner = cb.restore_precision](const std::string& op) {
        events.push_back("restore " + op + (h.raised_ops.count(op) ? " (raised)" : " (not raised)"));
        inner(op);
    };
    cb.reload_checkpoint = [&, inner = cb.reload_checkpoint] {
        events.push_back("reload");
        return inner();
    };
    // K = 3: matmul raised for steps 7, 8, 9; step 9 trips a reload (non-finite ladder: reload
    // first) before the raise has run out; the checkpoint holds step 4
    h.cfg.non_finite_ladder = {recovery_action::reload_checkpoint};
    h.script = {{"matmul.saturation", 6, {1}, 0.01}, {"grad.non_finite", 9, {1}, 1.0}};
    recovery_policy policy(h.cfg, cb);
    const recovery_log log = h.train(15, policy);
    REQUIRE(log.size() == 2);
    CHECK(log.entries()[1].action == recovery_action::reload_checkpoint);
    CHECK(log.entries()[1].resume_step == 5);
    CHECK(events ==
          std::vector<std::string>{"restore matmul (raised)", "reload"});  // once, on the state that raised it
    CHECK_FALSE(policy.raised("matmul"));
    // only the abandoned steps 7, 8, 9 ran raised; the replays of 5..9 and the rest did not
    std::vector<std::int64_t> hp_steps;
    for (const auto& [step, hp] : h.precision_of_step)
        if (hp) hp_steps.push_back(step);
    CHECK(hp_steps == std::vector<std::int64_t>{7, 8, 9});
    CHECK(h.state == clean_run(15, {}));  // the reloaded run is the low-precision run, bit for bit
}

TEST_CASE("a reload to a checkpoint that is not before the failing step is logged and reported") {
    harness h;
    h.cfg.non_finite_ladder = {recovery_action::reload_checkpoint};
    recovery_callbacks cb = h.callbacks();
    cb.reload_checkpoint = [&] {
        h.state.completed = 12;  // the user's state now holds step 12
        return reload_result{12, 8.0};
    };
    recovery_policy policy(h.cfg, cb);
    h.script = {{"matmul.saturation", 9, {1}, 0.01}, {"grad.non_finite", 12, {1}, 1.0}};
    for (std::int64_t step = 0; step < 12; ++step) policy.after_step((h.run(step), step), h.reg, 1.0);
    h.run(12);
    CHECK_THROWS_WITH_AS(
        policy.after_step(12, h.reg, 1.0),
        doctest::Contains(
            "returned checkpoint step 12 at failing step 12; the state has been reloaded and now holds step 12"),
        octet::error);
    REQUIRE(policy.log().size() == 2);  // the raise at 9, and the reload that did happen
    CHECK(policy.log().entries()[1].action == recovery_action::reload_checkpoint);
    CHECK(policy.log().entries()[1].reason.find("invalid: the checkpoint holds step 12") != std::string::npos);
    CHECK(h.restored == std::vector<std::string>{"matmul"});  // the raise ended before the reload
    CHECK_FALSE(policy.raised("matmul"));
}
