"""Mutation check: each test below must be able to fail, so each named one-line mutation of
the package must make the tests that target it fail.

For every mutation the package is copied to a temporary directory, one line is replaced
there (its original text must occur exactly once: a refactor that moves or rewrites the line
fails here with a message naming it, instead of letting the check pass vacuously), and the
targeted tests run in a subprocess that imports the copy. The copy wins over the editable
install because ``PYTHONPATH`` comes before the editable finder (which setuptools appends to
``sys.meta_path``) and ``python -P`` keeps the working directory (the checkout) off
``sys.path``; the subprocess also checks, after the run, that the package and the mutated
module it used were the copy's. The check passes only when pytest reports failed tests (exit
code 1): a mutation that survives (0), a collection or usage error (2-5) or a test run that
did not import the copy fails it, with the run's output.

The targets are kernel-level tests (pure numpy, no PyTensor graph), run with
``--noconftest`` (they need none of its fixtures): a run is a few seconds. The last test
runs every target on an unmutated copy, so a kill is the mutation's doing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pymc_bigdata"

HMCECS = "tests/kernels/test_hmcecs_kernel.py"
AUSTERITY = "tests/kernels/test_austerity_kernel.py"
EWSG = "tests/kernels/test_ewsg_kernel.py"
SBPS = "tests/kernels/test_sbps_kernel.py"
KERNELS = "tests/kernels/test_kernels.py"


class Mutation(NamedTuple):
    """One line of ``path`` (relative to the package) with ``original`` replaced by
    ``replacement``, and the test node ids that must fail on it."""

    name: str
    path: str
    original: str
    replacement: str
    tests: tuple[str, ...]


MUTATIONS = [
    Mutation(
        "hmcecs-subsample-update-always-accepts",
        "kernels/hmcecs.py",
        "if math.log(rng.uniform()) < log_ratio:",
        "if True:",
        (
            f"{HMCECS}::test_subsample_update_accepts_with_the_exact_ratio",
            f"{HMCECS}::test_subsample_chain_has_its_conditional_law",
        ),
    ),
    Mutation(
        "hmcecs-subsample-update-inverted-ratio",
        "kernels/hmcecs.py",
        "log_ratio = there.logp - here.logp if _finite(there) else -math.inf",
        "log_ratio = here.logp - there.logp if _finite(there) else -math.inf",
        (
            f"{HMCECS}::test_subsample_update_accepts_with_the_exact_ratio",
            f"{HMCECS}::test_subsample_chain_has_its_conditional_law",
        ),
    ),
    Mutation(
        "hmcecs-sign-negative-if-any-factor-is",
        "kernels/hmcecs.py",
        "sign = -1 if int(np.count_nonzero(shifted < 0)) % 2 else 1",
        "sign = -1 if int(np.count_nonzero(shifted < 0)) else 1",
        (f"{HMCECS}::test_block_poisson_sign_law",),
    ),
    Mutation(
        "hmcecs-block-proposal-returns-its-input",
        "kernels/hmcecs.py",
        "    block = int(rng.integers(len(u.bounds) - 1))",
        "    return u",
        (f"{HMCECS}::test_propose_block_redraws_one_block",),
    ),
    Mutation(
        "hmcecs-products-proposal-returns-its-input",
        "kernels/hmcecs.py",
        "    chosen = rng.choice(len(counts), size=refreshed, replace=False)",
        "    return u",
        (f"{HMCECS}::test_propose_products_redraws_kappa_products",),
    ),
    Mutation(
        "hmcecs-products-proposal-redraws-everything",
        "kernels/hmcecs.py",
        "chosen = rng.choice(len(counts), size=refreshed, replace=False)",
        "chosen = rng.choice(len(counts), size=len(counts), replace=False)",
        (f"{HMCECS}::test_propose_products_redraws_kappa_products",),
    ),
    Mutation(
        "dual-averaging-statistic-sign",
        "dual_averaging.py",
        "statistic = (1.0 - eta) * state.statistic + eta * (target - accept_prob)",
        "statistic = (1.0 - eta) * state.statistic + eta * (accept_prob - target)",
        (f"{HMCECS}::test_dual_averaging_reaches_its_target",),
    ),
    Mutation(
        "austerity-normal-tail-instead-of-student-t",
        "kernels/austerity.py",
        "delta = float(special.stdtr(n - 1, -abs(t)))",
        "delta = float(special.ndtr(-abs(t)))",
        (f"{AUSTERITY}::test_first_look_stops_at_level_two_epsilon",),
    ),
    Mutation(
        "austerity-student-t-with-n-df",
        "kernels/austerity.py",
        "delta = float(special.stdtr(n - 1, -abs(t)))",
        "delta = float(special.stdtr(n, -abs(t)))",
        (f"{AUSTERITY}::test_first_look_stops_at_level_two_epsilon",),
    ),
    Mutation(
        "austerity-epsilon-ignored",
        "kernels/austerity.py",
        "        if delta < epsilon:",
        "        if delta < 0.05:",
        (f"{AUSTERITY}::test_first_look_stops_at_level_two_epsilon",),
    ),
    Mutation(
        "ewsg-paper-weights-sign-flipped",
        "kernels/ewsg.py",
        "return 0.5 * np.vecdot(gap, gap) / update.noise_var",
        "return -0.5 * np.vecdot(gap, gap) / update.noise_var",
        (f"{EWSG}::test_index_chain_follows_eq4_law",),
    ),
    Mutation(
        "ewsg-linear-weights-doubled",
        "kernels/ewsg.py",
        "coefficient = (1.0 - update.decay) * update.kick / update.noise_var",
        "coefficient = 2.0 * (1.0 - update.decay) * update.kick / update.noise_var",
        (f"{EWSG}::test_index_chain_follows_eq4_law",),
    ),
    Mutation(
        "ewsg-index-acceptance-inverted",
        "kernels/ewsg.py",
        "take = np.log(rng.uniform(size=np.shape(log_w))) < log_w_new - log_w",
        "take = np.log(rng.uniform(size=np.shape(log_w))) < log_w - log_w_new",
        (f"{EWSG}::test_index_chain_follows_eq4_law",),
    ),
    Mutation(
        "ewsg-one-chain-acceptance-flipped",
        "kernels/ewsg.py",
        "if log_u < log_w_new - log_w:",
        "if log_u < log_w - log_w_new:",
        (f"{EWSG}::test_one_chain_decides_as_the_batched_chain",),
    ),
    Mutation(
        "sbps-eq17-beta-on-the-new-gradient",
        "kernels/sbps.py",
        "grad_sq = beta * grad_sq + (1.0 - beta) * gradient * gradient",
        "grad_sq = (1.0 - beta) * grad_sq + beta * gradient * gradient",
        (f"{SBPS}::test_metric_update_places_beta_on_the_past",),
    ),
    Mutation(
        "sbps-metric-adaptation-keeps-the-metric",
        "kernels/sbps.py",
        "grad_sq, metric = adapt_metric(grad_sq, gradient, *settings.metric_adaptation)",
        "grad_sq, _ = adapt_metric(grad_sq, gradient, *settings.metric_adaptation)",
        (f"{SBPS}::test_psbps_adapts_the_metric_at_every_bounce",),
    ),
    Mutation(
        "sgld-noise-variance-halved",
        "kernels/sgld.py",
        "noise = innovations * np.sqrt(step_size)",
        "noise = innovations * np.sqrt(0.5 * step_size)",
        (f"{KERNELS}::test_sgld_stationary_variance_matches_formula",),
    ),
    Mutation(
        "sghmc-eq15-friction-sign",
        "kernels/sghmc.py",
        "v = v + eta * g - alpha * v + noise[i]",
        "v = v + eta * g + alpha * v + noise[i]",
        (f"{KERNELS}::test_eq15_small_step_close_and_bhat_corrects",),
    ),
    Mutation(
        "sghmc-baoab-bhat-correction-dropped",
        "kernels/sghmc.py",
        "        else baoab_noise_weight(step_size, friction) * step_size**2 * grad_noise_var,",
        "        else 0.0 * grad_noise_var,",
        (f"{KERNELS}::test_baoab_noise_correction_removes_gradient_noise_bias",),
    ),
    Mutation(
        "signs-weights-over-the-draw-count",
        "signs.py",
        "    return signs / total",
        "    return signs / signs.size",
        ("tests/test_signs.py::test_sign_weights_are_the_signs_over_their_sum",),
    ),
    Mutation(
        "lazy-permutation-keeps-a-later-occurrence",
        "index_samplers.py",
        "        np.minimum.at(self._slot, candidates, positions)",
        "        self._slot[candidates] = positions",
        ("tests/test_rows.py::test_lazy_permutation_keeps_first_occurrences_in_order",),
    ),
    Mutation(
        "populated-memory-faulted-in-lazily",
        "memory.py",
        "    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate",
        "    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS",
        ("tests/test_memory.py::test_a_large_array_is_resident_before_its_first_write",),
    ),
    Mutation(
        "shared-rows-never-unlinked",
        "shared_rows.py",
        "    weakref.finalize(owner, segment.unlink)",
        "    weakref.finalize(owner, segment.close)",
        ("tests/test_shared_rows.py::test_a_pickled_column_names_its_shared_rows",),
    ),
]

#: runs pytest in the subprocess, then checks that the package and the modules the tests
#: were to exercise came from the copy: argv = copy, comma-separated modules, pytest arguments
_WRAPPER = """
import sys
import pytest

copy, modules = sys.argv[1], sys.argv[2].split(",")
code = int(pytest.main(sys.argv[3:]))
for name in ["pymc_bigdata", *modules]:
    where = getattr(sys.modules.get(name), "__file__", None) or ""
    if not where.startswith(copy):
        print(f"MUTATION-CHECK: {name} came from {where or 'nowhere'}, not {copy}")
        sys.exit(97)
sys.exit(code)
"""

#: pytest's exit codes other than 0 (passed) and 1 (tests failed)
_NOT_A_VERDICT = {2: "interrupted (collection error?)", 3: "internal error", 4: "usage error"}


def _copy_package(tmp_path: Path) -> Path:
    """The package copied under ``tmp_path`` (without byte code); returns the copy's root."""
    shutil.copytree(
        ROOT / PACKAGE, tmp_path / PACKAGE, ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path / PACKAGE


def _module_name(path: str) -> str:
    return f"{PACKAGE}.{path.removesuffix('.py').replace('/', '.')}"


def _run_tests(copy_root: Path, modules: list[str], tests: tuple[str, ...]) -> tuple[int, str]:
    """Run ``tests`` against the copy; return pytest's exit code and the run's output."""
    path = [str(copy_root.parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST"):
        env.pop(name, None)
    command = [
        sys.executable,
        "-P",
        "-c",
        _WRAPPER,
        str(copy_root.parent),
        ",".join(modules),
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        *tests,
    ]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    return done.returncode, (done.stdout + done.stderr)[-4000:]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_mutation_is_caught(mutation: Mutation, tmp_path: Path):
    """The targeted tests fail (exit code 1) on the mutated copy."""
    copy_root = _copy_package(tmp_path)
    target = copy_root / mutation.path
    source = target.read_text()
    found = source.count(mutation.original)
    assert found == 1, (
        f"{mutation.name}: {mutation.original!r} occurs {found} times in "
        f"{PACKAGE}/{mutation.path} (expected once): the line moved or changed; update the "
        "mutation (and check that its tests still target it)"
    )
    target.write_text(source.replace(mutation.original, mutation.replacement))
    code, output = _run_tests(copy_root, [_module_name(mutation.path)], mutation.tests)
    assert code != 0, f"{mutation.name} survived: the targeted tests passed\n{output}"
    assert code == 1, (
        f"{mutation.name}: pytest exit code {code} "
        f"({_NOT_A_VERDICT.get(code, 'the run did not use the copy' if code == 97 else '?')}),"
        f" not a test failure\n{output}"
    )


def test_targets_pass_on_the_unmutated_copy(tmp_path: Path):
    """Every targeted test passes on an unmutated copy run the same way (and imports it): a
    failure above is the mutation's doing, not the harness's or a broken test's."""
    copy_root = _copy_package(tmp_path)
    targets = tuple(dict.fromkeys(t for m in MUTATIONS for t in m.tests))
    modules = sorted({_module_name(m.path) for m in MUTATIONS})
    code, output = _run_tests(copy_root, modules, targets)
    assert code == 0, f"pytest exit code {code} on the unmutated copy\n{output}"
