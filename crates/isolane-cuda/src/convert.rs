//! f32 → f16 / bf16 conversion of weights on the host (round to nearest even, as the GPU's
//! `cvt.rn` does), so that uploaded constants equal what a cast kernel would produce.

use crate::plan::DType;

/// IEEE binary16 bits of `x`, rounded to nearest even; overflow gives ±inf, NaN stays NaN.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // Subnormal (or zero) in f16: shift the mantissa with its implicit bit.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1u32 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1; // may carry into the exponent, which is the correct rounding to the next binade
    }
    sign | r as u16
}

/// f16 bits → f32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Normalise the subnormal.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// bfloat16 bits of `x`, rounded to nearest even.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    ((b.wrapping_add(round)) >> 16) as u16
}

/// Appends `data` to `out` in the device dtype's bytes (little-endian).
pub fn push_converted(out: &mut Vec<u8>, data: &[f32], dtype: DType) {
    match dtype {
        DType::F32 => {
            for v in data {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            for v in data {
                out.extend_from_slice(&f32_to_f16(*v).to_le_bytes());
            }
        }
        DType::Bf16 => {
            for v in data {
                out.extend_from_slice(&f32_to_bf16(*v).to_le_bytes());
            }
        }
    }
}

/// bf16 bits → f32 (exact: bf16 is f32's upper half).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Little-endian device values of `dtype` → f32.
pub fn to_f32(raw: &[u8], dtype: DType) -> Vec<f32> {
    match dtype {
        DType::F32 => raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => raw
            .chunks_exact(2)
            .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        DType::Bf16 => raw
            .chunks_exact(2)
            .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_and_rounding() {
        for &(x, bits) in &[
            (0.0f32, 0x0000u16),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65520.0, 0x7c00), // rounds up to inf
            (5.960_464_5e-8, 0x0001),
            (0.333_333_34, 0x3555),
        ] {
            assert_eq!(f32_to_f16(x), bits, "{x}");
        }
        // Every finite f16 round-trips exactly.
        for h in 0u16..=0xffff {
            let e = (h >> 10) & 0x1f;
            if e == 0x1f {
                continue;
            }
            assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
        }
        // Ties go to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10.
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(-1.0), 0xbf80);
        // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 2f32.powi(-8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * 2f32.powi(-8)), 0x3f82);
        assert!(f32::from_bits((f32_to_bf16(f32::NAN) as u32) << 16).is_nan());
    }
}
