import numpy as np
import pytest
from sklearn.linear_model import LinearRegression

from ppprof.fit.regress import Unfittable, condition_number, cross_validate, fit_candidates, fit_model, ineligible
from ppprof.fit.samples import make_samples
from ppprof.policy.rule import LatencyModel

PREFIX_TRUE = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)
QUAD_TRUE = LatencyModel("quadratic", a=3e-7, b=0.01, c=5.0)


def arrays(frame):
    return (frame.prefix_len.to_numpy(), frame.chunk_len.to_numpy(), frame.stage0_latency_ms.to_numpy())


def prefix_frame(model=PREFIX_TRUE, noise=0.01, **kw):
    return make_samples(model, base_chunk_size=4096, prefixes=[0, 8192, 32768, 65536],
                        chunk_sizes=[512, 1024, 2048, 4096], noise=noise, **kw)


def test_prefix_fit_recovers_coefficients():
    got = fit_model("prefix", *arrays(prefix_frame()))
    for key in ("a", "b", "c", "g"):
        want = getattr(PREFIX_TRUE, key)
        assert abs(getattr(got, key) - want) <= 0.1 * want, f"{key=} {got=}"


def test_quadratic_fit_recovers_coefficients():
    L, x, y = arrays(make_samples(QUAD_TRUE, base_chunk_size=8192, noise=0.005))
    got = fit_model("quadratic", L[1:], x[1:], y[1:])
    assert abs(got.a - QUAD_TRUE.a) <= 0.05 * QUAD_TRUE.a, f"{got=}"
    assert abs(got.b - QUAD_TRUE.b) <= 0.05 * QUAD_TRUE.b, f"{got=}"
    assert got.g == 0.0


def test_quadratic_clamps_negative_b_and_rejects_non_positive_a():
    l = np.arange(1, 20, dtype=float) * 100
    zeros = np.zeros_like(l, dtype=np.int64)
    got = fit_model("quadratic", zeros, l.astype(np.int64), 1e-4 * l**2 - 0.01 * l + 50)
    assert got.b == 0.0 and got.a == pytest.approx(1e-4), f"{got=}"
    with pytest.raises(Unfittable, match="a = .* <= 0"):
        fit_model("quadratic", zeros, l.astype(np.int64), 0.5 * l + 3 - 1e-5 * l**2)


def test_prefix_negative_term_is_dropped_and_refitted_not_clamped():
    truth = LatencyModel("prefix", a=2e-7, b=0.012, c=5.0, g=0.0)
    frame = prefix_frame(truth, noise=0.0)
    L, x, y = arrays(frame)
    y = y - 3e-5 * L  # a negative prefix slope: g must go, the rest absorbs it
    got = fit_model("prefix", L, x, y)
    assert got.g == 0.0
    assert min(got.a, got.b, got.c) >= 0.0
    ref = LinearRegression().fit(np.column_stack([x, 2.0 * L * x + x * x]), y)
    assert got.b == pytest.approx(ref.coef_[0]) and got.a == pytest.approx(ref.coef_[1]), f"{got=}"
    assert got.c == pytest.approx(ref.intercept_)


def test_outliers_are_dropped_and_fit_survives():
    L, x, y = arrays(prefix_frame(num_outliers=6, seed=3))
    fitted, failed = fit_candidates(L[1:], x[1:], y[1:], "prefix")
    model, keep, cv = fitted["prefix"]
    assert (~keep).sum() >= 6, f"{(~keep).sum()=}"
    assert abs(model.a - PREFIX_TRUE.a) <= 0.1 * PREFIX_TRUE.a, f"{model=}"
    assert cv < 0.03, f"{cv=}"


def test_eligibility_messages():
    assert "3 distinct prefixes" in ineligible("prefix", np.array([0, 0, 10, 10]), np.array([1, 2, 1, 2]))
    assert "2 distinct chunk sizes" in ineligible("prefix", np.array([0, 5, 10]), np.array([1, 1, 1]))
    assert ineligible("quadratic", np.zeros(7, dtype=int), np.arange(1, 8)) is not None
    assert ineligible("quadratic", np.zeros(8, dtype=int), np.arange(1, 9)) is None


def test_auto_prefers_the_generating_model_by_cv():
    L, x, y = arrays(prefix_frame())
    fitted, _ = fit_candidates(L[1:], x[1:], y[1:], "auto")
    assert fitted["prefix"][2] < fitted.get("quadratic", (None, None, np.inf))[2]
    L, x, y = arrays(make_samples(QUAD_TRUE, base_chunk_size=8192))
    fitted, failed = fit_candidates(L[1:], x[1:], y[1:], "auto")
    assert set(fitted) == {"quadratic"} and "prefix" in failed


def test_cross_validation_and_condition_number():
    L, x, y = arrays(prefix_frame(noise=0.0))
    assert cross_validate("prefix", L, x, y) < 1e-6
    assert cross_validate("prefix", L, x, y * (1 + 0.2 * np.sin(np.arange(len(y))))) > 0.05
    assert condition_number("prefix", L, x) < 100
    assert condition_number("prefix", np.zeros_like(L), x) == float("inf")  # an all-zero column
