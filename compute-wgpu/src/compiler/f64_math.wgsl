// f64 exp, expm1, log, log1p, sin/cos, tanh, erf and pow for the wgpu backend's WGSL: Vulkan's
// GLSL.std.450 functions take 16/32-bit floats only, and drivers' results on f64 range from
// garbage (lavapipe: exp(0) = 5.3e-315) to whatever they choose. Accurate to a few ulp:
// - exp: k = round(x / ln2), r = x - k ln2 (two-part ln2, fma), Taylor series of degree 13 on
//   |r| <= ln2 / 2, scaled by 2^k in two steps (subnormal results included);
// - log: x = m 2^e with m in [sqrt(2)/2, sqrt(2)], s = (m - 1) / (m + 1),
//   log m = 2 atanh(s) (series to s^23), plus e ln2 (two-part);
// - log1p: log(1 + x) * x / ((1 + x) - 1), which cancels the rounding of 1 + x;
// - sin/cos: Cody-Waite reduction by a three-part pi/2 (fdlibm's split) and fdlibm's kernels;
// - tanh: -expm1(-2|x|) / (2 + expm1(-2|x|)), signed;
// - erf: 2/sqrt(pi) exp(-x^2) sum x (2x^2)^n / (2n+1)!! (all terms positive), 1 beyond |x| = 6;
// - pow: exp(y log|x|), signed for negative x and odd integer y, NaN for non-integer y.

fn _f64_pow2(k: i32) -> f64 {
    return bitcast<f64>(u64(k + 1023i) << 52u);
}

fn _f64_scale(x: f64, k: i32) -> f64 {
    let h = k / 2i;
    return x * _f64_pow2(h) * _f64_pow2(k - h);
}

fn _f64_exp(x: f64) -> f64 {
    if (!(x == x)) { return x; }
    if (x > f64(709.782712893384)) { return bitcast<f64>(9218868437227405312lu); }
    if (x < f64(-745.1332191019412)) { return f64(0.0); }
    let k = round(x * f64(1.4426950408889634));
    var r = fma(-k, f64(6.93147180369123816490e-01), x);
    r = fma(-k, f64(1.90821492927058770002e-10), r);
    return _f64_scale(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(f64(1.6059043836821613e-10), r, f64(2.08767569878681e-09)), r, f64(2.505210838544172e-08)), r, f64(2.755731922398589e-07)), r, f64(2.7557319223985893e-06)), r, f64(2.48015873015873e-05)), r, f64(0.0001984126984126984)), r, f64(0.001388888888888889)), r, f64(0.008333333333333333)), r, f64(0.041666666666666664)), r, f64(0.16666666666666666)), r, f64(0.5)), r, f64(1.0)), r, f64(1.0)), i32(k));
}

fn _f64_expm1(x: f64) -> f64 {
    if (abs(x) < f64(0.34657359027997264)) {
        return x * fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(f64(1.1470745597729725e-11), x, f64(1.6059043836821613e-10)), x, f64(2.08767569878681e-09)), x, f64(2.505210838544172e-08)), x, f64(2.755731922398589e-07)), x, f64(2.7557319223985893e-06)), x, f64(2.48015873015873e-05)), x, f64(0.0001984126984126984)), x, f64(0.001388888888888889)), x, f64(0.008333333333333333)), x, f64(0.041666666666666664)), x, f64(0.16666666666666666)), x, f64(0.5)), x, f64(1.0));
    }
    return _f64_exp(x) - f64(1.0);
}

fn _f64_log(x: f64) -> f64 {
    if (!(x == x) || x < f64(0.0)) { return bitcast<f64>(9221120237041090560lu); }
    if (x == f64(0.0)) { return bitcast<f64>(18442240474082181120lu); }
    if (x == bitcast<f64>(9218868437227405312lu)) { return x; }
    var v = x;
    var e = 0i;
    if (v < f64(2.2250738585072014e-308)) {
        v = v * f64(18014398509481984.0);
        e = -54i;
    }
    let bits = bitcast<u64>(v);
    e = e + i32((bits >> 52u) & 2047lu) - 1023i;
    var m = bitcast<f64>((bits & 4503599627370495lu) | 4607182418800017408lu);
    if (m > f64(1.4142135623730951)) {
        m = m * f64(0.5);
        e = e + 1i;
    }
    let f = m - f64(1.0);
    let s = f / (f64(2.0) + f);
    let z = s * s;
    let t = z * fma(fma(fma(fma(fma(fma(fma(fma(fma(fma(f64(0.043478260869565216), z, f64(0.047619047619047616)), z, f64(0.05263157894736842)), z, f64(0.058823529411764705)), z, f64(0.06666666666666667)), z, f64(0.07692307692307693)), z, f64(0.09090909090909091)), z, f64(0.1111111111111111)), z, f64(0.14285714285714285)), z, f64(0.2)), z, f64(0.3333333333333333));
    let lm = fma(f64(2.0) * s, t, f64(2.0) * s);
    let ef = f64(e);
    return fma(ef, f64(6.93147180369123816490e-01), fma(ef, f64(1.90821492927058770002e-10), lm));
}

fn _f64_log1p(x: f64) -> f64 {
    let u = f64(1.0) + x;
    if (u == f64(1.0)) { return x; }
    if (u == bitcast<f64>(9218868437227405312lu)) { return u; }
    return _f64_log(u) * (x / (u - f64(1.0)));
}

fn _f64_sincos(x: f64, shift: u32) -> f64 {
    let k = round(x * f64(0.6366197723675814));
    var r = fma(-k, f64(1.57079632673412561417e+00), x);
    r = fma(-k, f64(6.07710050630396597660e-11), r);
    r = fma(-k, f64(2.02226624871116645580e-21), r);
    let z = r * r;
    let s = fma(r * z, fma(fma(fma(fma(fma(f64(1.58969099521155e-10), z, f64(-2.5050760253406863e-08)), z, f64(2.7557313707070068e-06)), z, f64(-0.0001984126982985795)), z, f64(0.00833333333332249)), z, f64(-0.16666666666666632)), r);
    let hz = f64(0.5) * z;
    let w = f64(1.0) - hz;
    let c = w + (((f64(1.0) - w) - hz) + z * z * fma(fma(fma(fma(fma(f64(-1.1359647557788195e-11), z, f64(2.087572321298175e-09)), z, f64(-2.7557314351390663e-07)), z, f64(2.480158728947673e-05)), z, f64(-0.001388888888887411)), z, f64(0.0416666666666666)));
    let q = (bitcast<u32>(i32(k)) + shift) & 3u;
    let v = select(s, c, (q & 1u) == 1u);
    return select(v, -v, q >= 2u);
}

fn _f64_tanh(x: f64) -> f64 {
    let a = abs(x);
    if (a > f64(22.0)) { return select(f64(1.0), f64(-1.0), x < f64(0.0)); }
    let e = _f64_expm1(f64(-2.0) * a);
    let t = -e / (f64(2.0) + e);
    return select(t, -t, x < f64(0.0));
}

fn _f64_erf(x: f64) -> f64 {
    if (!(x == x) || x == f64(0.0)) { return x; }
    let a = abs(x);
    if (a >= f64(6.0)) { return select(f64(1.0), f64(-1.0), x < f64(0.0)); }
    let t2 = f64(2.0) * a * a;
    var term = a;
    var sum = a;
    for (var n = 1u; n < 400u; n = n + 1u) {
        term = term * t2 / f64(2u * n + 1u);
        sum = sum + term;
        if (term < sum * f64(1e-17)) { break; }
    }
    let r = f64(1.1283791670955126) * _f64_exp(-a * a) * sum;
    return select(r, -r, x < f64(0.0));
}

fn _f64_pow(x: f64, y: f64) -> f64 {
    if (y == f64(0.0) || x == f64(1.0)) { return f64(1.0); }
    let r = _f64_exp(y * _f64_log(abs(x)));
    if (x < f64(0.0)) {
        if (floor(y) != y) { return bitcast<f64>(9221120237041090560lu); }
        let odd = f64(0.5) * y != floor(f64(0.5) * y);
        return select(r, -r, odd);
    }
    return r;
}
