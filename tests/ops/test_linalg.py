"""linalg lowerings against CPU torch (LAPACK); vectors with a sign/phase freedom are
compared through the identities they must satisfy."""
import pytest
import torch

from tests.ops.harness import check, device_available, run_lowering, run_pjrt

aten = torch.ops.aten
TOL = dict(atol=1e-4, rtol=1e-4)
DTYPES = [torch.float32, torch.float64, torch.complex64]


def r(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype)


def spd(*shape, dtype=torch.float32, seed=0):
    a = r(*shape, dtype=dtype, seed=seed)
    return a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def run(op, *args, **kwargs):
    """Only the pjrt result (for outputs defined up to sign/phase)."""
    return run_pjrt(op, *args, **kwargs)[0] if device_available() else run_lowering(op, *args, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(dtype, upper):
    a = spd(2, 4, 4, dtype=dtype)
    L, info = check(aten.linalg_cholesky_ex.default, a, upper=upper, **TOL)
    if hasattr(aten, "cholesky"):  # torch 2.14 removed aten::cholesky; linalg_cholesky_ex above covers it there
        check(aten.cholesky.default, a, upper, **TOL)
    b = r(2, 4, 3, dtype=dtype, seed=1)
    check(aten.cholesky_solve.default, b, L, upper, **TOL)
    check(aten._cholesky_solve_helper.default, b, L, upper, **TOL)
    check(aten.cholesky_inverse.default, L[0], upper, **TOL)


def test_cholesky_info_not_positive_definite():
    m = torch.eye(3)
    m[1, 1] = -1
    _, info = run(aten.linalg_cholesky_ex.default, torch.stack([torch.eye(3), m, -torch.eye(3)]))
    torch.testing.assert_close(info, aten.linalg_cholesky_ex(torch.stack([torch.eye(3), m, -torch.eye(3)]))[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_lu_family(dtype):
    a = r(2, 4, 4, dtype=dtype)
    lu, piv, info = check(aten.linalg_lu_factor_ex.default, a, **TOL)
    assert piv.dtype == torch.int32 and info.dtype == torch.int32
    b = r(2, 4, 3, dtype=dtype, seed=1)
    for left in (True, False):
        for adjoint in (False, True):
            rhs = b if left else b.mT
            check(aten.linalg_lu_solve.default, lu, piv, rhs, left=left, adjoint=adjoint, **TOL)
    check(aten.linalg_lu.default, a, **TOL)
    check(aten.linalg_lu.default, r(5, 3, dtype=dtype), **TOL)
    check(aten.linalg_lu.default, r(3, 5, dtype=dtype), **TOL)
    for data, pivots in ((True, True), (False, True), (True, False)):
        check(aten.lu_unpack.default, lu, piv, data, pivots, **TOL)
    check(aten.linalg_inv_ex.default, a, **TOL)
    check(aten._linalg_det.default, a, **TOL)
    check(aten._linalg_slogdet.default, a, **TOL)


def test_solve():
    a = r(2, 4, 4)
    check(aten._linalg_solve_ex.default, a, r(2, 4, 3, seed=1), **TOL)
    check(aten._linalg_solve_ex.default, a, r(2, 4, seed=1), **TOL)  # batch of vectors
    check(aten._linalg_solve_ex.default, a, r(4, seed=1), **TOL)  # broadcast vector
    check(aten._linalg_solve_ex.default, a, r(2, 3, 4, seed=1), left=False, **TOL)
    check(aten._linalg_solve_ex.default, a[0], r(3, 4, 2, seed=1), **TOL)  # broadcast A


def test_singular_info_and_det():
    m = torch.tensor([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]])
    _, info = run(aten.linalg_inv_ex.default, m)
    assert int(info) > 0
    # the LU factors of a singular matrix follow rounding: a pivot is 0 or an ulp (CPU torch's
    # LAPACK gives -1.2e-7 on some CPUs, 0 on others), and the multiplier under it 0 or 0.5.
    # Compared: the determinant, the pivots, and that the factors reproduce the matrix (the
    # factors are of its column-major layout, the transpose, on CPU as on pjrt).
    det, lu, pivots = run(aten._linalg_det.default, m)
    cpu_det, cpu_lu, cpu_pivots = aten._linalg_det.default(m)
    torch.testing.assert_close(det.cpu(), cpu_det, **TOL)
    assert torch.equal(pivots.cpu(), cpu_pivots)
    for factors in (lu.cpu(), cpu_lu):
        p_, l_, u_ = torch.lu_unpack(factors, pivots.cpu())
        torch.testing.assert_close(p_ @ l_ @ u_, m.mT, **TOL)
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]])  # one row swap: det -1
    check(aten._linalg_det.default, p)
    check(aten._linalg_slogdet.default, -p * 3)


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("left", [False, True])
def test_triangular_solves(upper, left):
    a = r(2, 4, 4).triu() if upper else r(2, 4, 4).tril()
    a = a + 4 * torch.eye(4)
    b = r(2, 4, 3, seed=1) if left else r(2, 3, 4, seed=1)
    for unit in (False, True):
        check(aten.linalg_solve_triangular.default, a, b, upper=upper, left=left, unitriangular=unit, **TOL)
    if left:
        for transpose in (False, True):
            check(aten.triangular_solve.default, b, a, upper, transpose, False, **TOL)
        check(aten.triangular_solve.default, b, a[0], upper, False, True, **TOL)  # broadcast A


@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_qr(mode, shape):
    a = r(*shape)
    q, rr = run(aten.linalg_qr.default, a, mode)
    eq, er = aten.linalg_qr(a, mode)
    assert q.shape == eq.shape and rr.shape == er.shape
    # R is unique up to the signs of its rows
    sign = torch.sgn(torch.diagonal(rr, dim1=-2, dim2=-1)) * torch.sgn(torch.diagonal(er, dim1=-2, dim2=-1))
    k = sign.shape[-1]
    torch.testing.assert_close(rr[..., :k, :] * sign[..., :, None], er[..., :k, :], **TOL)
    if mode != "r":
        torch.testing.assert_close(q @ rr, a, **TOL)
        eye = torch.eye(q.shape[-1]).expand(q.shape[:-2] + (q.shape[-1], q.shape[-1]))
        torch.testing.assert_close(q.mT @ q, eye, **TOL)


def test_geqrf_householder_ormqr():
    a = r(5, 3)
    ha, tau = check(aten.geqrf.default, a, **TOL)
    check(aten.linalg_householder_product.default, ha, tau, **TOL)
    c = r(5, 2, seed=1)
    for left in (True, False):
        for transpose in (False, True):
            other = c if left else c.mT
            check(aten.ormqr.default, ha, tau, other, left, transpose, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
@pytest.mark.parametrize("uplo", ["L", "U"])
def test_eigh(dtype, uplo):
    a = spd(2, 5, 5, dtype=dtype)
    # only the UPLO triangle may be read
    a_tri = a.tril() if uplo == "L" else a.triu()
    w, v = run(aten._linalg_eigh.default, a_tri, uplo, True)
    ew, _ = aten._linalg_eigh(a_tri, uplo, True)
    torch.testing.assert_close(w, ew, **TOL)
    assert w.dtype == ew.dtype
    torch.testing.assert_close(v @ torch.diag_embed(w).to(dtype) @ v.mH, a, atol=1e-3, rtol=1e-4)
    check(aten._linalg_eigh.default, a_tri, uplo, False, **TOL)


@pytest.mark.parametrize("full", [False, True])
@pytest.mark.parametrize("shape", [(5, 3), (3, 5), (2, 4, 4)])
def test_svd(full, shape):
    a = r(*shape)
    u, s, vh = run(aten._linalg_svd.default, a, full, True)
    eu, es, evh = aten._linalg_svd(a, full, True)
    assert (u.shape, s.shape, vh.shape) == (eu.shape, es.shape, evh.shape)
    torch.testing.assert_close(s, es, **TOL)
    k = s.shape[-1]
    torch.testing.assert_close(u[..., :, :k] @ torch.diag_embed(s) @ vh[..., :k, :], a, **TOL)
    # singular vectors agree with LAPACK's up to sign
    sign = torch.sgn((u[..., :, :k] * eu[..., :, :k]).sum(-2))
    torch.testing.assert_close(u[..., :, :k] * sign[..., None, :], eu[..., :, :k], **TOL)
    check(aten._linalg_svd.default, a, full, False, **TOL)


def test_eig():
    a = r(4, 4)
    w, v = run(aten.linalg_eig.default, a)
    ew, ev = aten.linalg_eig(a)
    assert w.dtype == ew.dtype == torch.complex64
    key = lambda t: (t.real * 1000).round() + t.imag  # noqa: E731
    torch.testing.assert_close(w[key(w).argsort()], ew[key(ew).argsort()], **TOL)
    torch.testing.assert_close(a.to(v.dtype) @ v, v * w, **TOL)
    w2 = run(aten._linalg_eigvals.default, a)
    torch.testing.assert_close(w2[key(w2).argsort()], ew[key(ew).argsort()], **TOL)


def test_matrix_exp():
    check(aten.linalg_matrix_exp.default, r(4, 4) * 0.5, **TOL)
    check(aten.linalg_matrix_exp.default, r(2, 3, 3, 3, dtype=torch.float64))
    # half types (CPU computes them in half precision; here against float32 rounded once)
    x = r(3, 3) * 0.5
    for dtype in (torch.float16, torch.bfloat16):
        got = run(aten.linalg_matrix_exp.default, x.to(dtype))
        assert got.dtype == dtype
        torch.testing.assert_close(got, torch.linalg.matrix_exp(x).to(dtype))


def test_kron_out_writes_through_unsafe_view():
    """kron(out=) computes into an _unsafe_view of out, which must alias it (as on CPU)."""
    a, b = r(3, 4), r(2, 5, seed=1)
    out = torch.empty(0, device="pjrt") if device_available() else None
    if out is None:
        pytest.skip("needs the pjrt device (out= and aliasing are eager behaviours)")
    torch.kron(a.to("pjrt"), b.to("pjrt"), out=out)
    torch.testing.assert_close(out.cpu(), torch.kron(a, b))


@pytest.mark.parametrize("driver", [None, "gelsy", "gelsd", "gelss", "gels"])
def test_lstsq(driver):
    a, b = r(2, 6, 3), r(2, 6, 2, seed=1)
    check(aten.linalg_lstsq.default, a, b, None, driver=driver, **TOL)
    if driver != "gels":
        check(aten.linalg_lstsq.default, r(3, 5), r(3, 2, seed=1), None, driver=driver, **TOL)  # underdetermined


def test_cross():
    check(aten.linalg_cross.default, r(4, 3), r(4, 3, seed=1), **TOL)
    check(aten.linalg_cross.default, r(3, 5), r(1, 5, seed=1).expand(3, 5).contiguous(), dim=0, **TOL)
    check(aten.linalg_cross.default, r(2, 4, 3), r(1, 4, 3, seed=1), **TOL)


@pytest.mark.parametrize("shape", [(3, 2**20), (2**18, 3), (2, 3, 40), (5, 5)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.complex64])
def test_svdvals_of_a_long_matrix(shape, dtype):
    """PyTorch's test_svd_memory_allocation: JAX's LAPACK call declared an n x n output for the
    singular values of a 3 x 2^20 matrix (out of memory). The values are CPU's (float64) and, in
    single precision, at least as close to float64's as CPU's own."""
    a = torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    actual = torch.linalg.svdvals(a.to("pjrt")).cpu()
    reference = torch.linalg.svdvals(a.to(torch.complex128 if dtype.is_complex else torch.float64))
    cpu_error = ((torch.linalg.svdvals(a).double() - reference) / reference).abs().max()
    assert ((actual.double() - reference) / reference).abs().max() <= max(float(cpu_error), 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.complex128])
def test_slogdet_of_singular_matrices(dtype):
    """A singular matrix's sign is 0 on CPU; the complex lowering divided 0 by |0| (nan + nan j),
    which PyTorch's test_slogdet found."""
    a = torch.stack([torch.ones(3, 3), torch.randn(3, 3, generator=torch.Generator().manual_seed(0))]).to(dtype)
    sign, logabsdet = torch.linalg.slogdet(a.to("pjrt"))
    expected_sign, expected_logabsdet = torch.linalg.slogdet(a)
    torch.testing.assert_close(sign.cpu(), expected_sign, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logabsdet.cpu(), expected_logabsdet, atol=1e-5, rtol=1e-5)
