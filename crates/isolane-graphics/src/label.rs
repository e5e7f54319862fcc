//! Box labels, `<class>:<score>` (e.g. `3:0.93`) in a 5x7 pixel font scaled by an integer:
//! which glyphs, and where. One definition for the renderer (which uploads the font and places
//! glyph quads) and the CPU reference (which draws the same cells).

use crate::BoxOverlay;

/// Glyph cells: 5 wide, 7 high; glyphs advance by 6 cells.
pub(crate) const GLYPH_W: u32 = 5;
pub(crate) const GLYPH_H: u32 = 7;
pub(crate) const ADVANCE: u32 = 6;
/// Most glyphs in a label: 3 class digits, `:`, `d.dd`.
pub(crate) const MAX_GLYPHS: usize = 8;

/// Coordinates beyond this many pixels are treated as this far (no frame is that large).
const FAR: f32 = (1 << 24) as f32;

const DOT: u8 = 10;
const COLON: u8 = 11;

/// Rows top to bottom, 5 bits each, the most significant the leftmost cell: digits 0-9, `.`, `:`.
pub(crate) const FONT: [[u8; 7]; 12] = [
    [
        0b01110, 0b10001, 0b10011, 0b10101, 0b11001, 0b10001, 0b01110,
    ],
    [
        0b00100, 0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110,
    ],
    [
        0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b01000, 0b11111,
    ],
    [
        0b11111, 0b00010, 0b00100, 0b00010, 0b00001, 0b10001, 0b01110,
    ],
    [
        0b00010, 0b00110, 0b01010, 0b10010, 0b11111, 0b00010, 0b00010,
    ],
    [
        0b11111, 0b10000, 0b11110, 0b00001, 0b00001, 0b10001, 0b01110,
    ],
    [
        0b00110, 0b01000, 0b10000, 0b11110, 0b10001, 0b10001, 0b01110,
    ],
    [
        0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b01000, 0b01000,
    ],
    [
        0b01110, 0b10001, 0b10001, 0b01110, 0b10001, 0b10001, 0b01110,
    ],
    [
        0b01110, 0b10001, 0b10001, 0b01111, 0b00001, 0b00010, 0b01100,
    ],
    [
        0b00000, 0b00000, 0b00000, 0b00000, 0b00000, 0b01100, 0b01100,
    ],
    [
        0b00000, 0b01100, 0b01100, 0b00000, 0b01100, 0b01100, 0b00000,
    ],
];

/// Whether cell (`x`, `y`) of `glyph` is set.
pub(crate) fn cell_set(glyph: u8, x: u32, y: u32) -> bool {
    (FONT[usize::from(glyph)][y as usize] >> (GLYPH_W - 1 - x)) & 1 == 1
}

/// The glyphs of `b`'s label and how many there are: the class, `:`, the score with two
/// decimals, clamped to 0–9.99.
pub(crate) fn glyphs(b: &BoxOverlay) -> ([u8; MAX_GLYPHS], usize) {
    let mut out = [0u8; MAX_GLYPHS];
    let mut n = 0;
    let mut push = |g: u8| {
        out[n] = g;
        n += 1;
    };
    if b.class >= 100 {
        push(b.class / 100);
    }
    if b.class >= 10 {
        push(b.class / 10 % 10);
    }
    push(b.class % 10);
    push(COLON);
    let hundredths = (b.score.clamp(0.0, 9.99) * 100.0).round() as u32;
    push((hundredths / 100) as u8);
    push(DOT);
    push((hundredths / 10 % 10) as u8);
    push((hundredths % 10) as u8);
    (out, n)
}

/// The label's top-left pixel: just above the box, left-aligned, or just inside its top edge
/// when there is no room above. Whole pixels, so that the glyph cells are whole pixels.
pub(crate) fn origin(b: &BoxOverlay, scale: u32, line_width: f32) -> (i32, i32) {
    // Far off the frame either way is the same; the clamp keeps the arithmetic in range.
    let whole = |v: f32| v.floor().clamp(-FAR, FAR) as i32;
    let (x0, y0) = (whole(b.x0), whole(b.y0));
    let above = y0 - (GLYPH_H * scale) as i32 - 1;
    let y = if above >= 0 {
        above
    } else {
        y0 + line_width.ceil().min(FAR) as i32 + 1
    };
    (x0, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(class: u8, score: f32) -> Vec<u8> {
        let b = BoxOverlay {
            x0: 0.0,
            y0: 0.0,
            x1: 1.0,
            y1: 1.0,
            class,
            score,
        };
        let (g, n) = glyphs(&b);
        g[..n].to_vec()
    }

    #[test]
    fn labels_are_class_colon_score() {
        assert_eq!(labelled(3, 0.934), [3, COLON, 0, DOT, 9, 3]);
        assert_eq!(labelled(42, 1.0), [4, 2, COLON, 1, DOT, 0, 0]);
        assert_eq!(labelled(255, 0.005), [2, 5, 5, COLON, 0, DOT, 0, 1]);
        assert_eq!(labelled(7, 123.0), [7, COLON, 9, DOT, 9, 9]);
        assert_eq!(labelled(0, -1.0), [0, COLON, 0, DOT, 0, 0]);
    }

    #[test]
    fn labels_sit_above_the_box_or_inside_its_top() {
        let b = BoxOverlay {
            x0: 10.7,
            y0: 30.2,
            x1: 50.0,
            y1: 60.0,
            class: 1,
            score: 1.0,
        };
        assert_eq!(origin(&b, 2, 2.0), (10, 30 - 14 - 1));
        let top = BoxOverlay { y0: 3.0, ..b };
        assert_eq!(origin(&top, 2, 2.0), (10, 3 + 2 + 1));
    }

    #[test]
    fn huge_coordinates_do_not_overflow() {
        let far = BoxOverlay {
            x0: 3e38,
            y0: -3e38,
            x1: 3e38,
            y1: 3e38,
            class: 1,
            score: 1.0,
        };
        let (x, y) = origin(&far, 64, 1e30);
        assert_eq!(x, 1 << 24);
        // No room above -2^24: inside, -2^24 + a line width clamped to 2^24 + 1.
        assert_eq!(y, 1);
    }

    #[test]
    fn the_font_draws_a_one() {
        let column: Vec<bool> = (0..GLYPH_H).map(|y| cell_set(1, 2, y)).collect();
        assert_eq!(column, [true; 7]);
        assert!(!cell_set(1, 0, 0) && cell_set(1, 1, 1));
    }
}
