// Box labels: each glyph is one instance of 6 vertices (a quad of 5x7 cells, `label_scale`
// pixels each); the fragment shader keeps the pixels of the glyph's set cells.

struct Params {
    frame_size: vec2<u32>,
    mask_size: vec2<u32>,
    mask_alpha: f32,
    has_mask: u32,
    line_width: f32,
    label_scale: u32,
    palette: array<vec4<f32>, 256>,
    // The font: glyph g's row r is word 7g + r, four words to a vector.
    font: array<vec4<u32>, 21>,
}

struct GpuGlyph {
    // Top-left pixel of the glyph (whole pixels).
    origin: vec2<f32>,
    glyph: u32,
    _pad: u32,
    colour: vec4<f32>,
}

@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(5) var<storage, read> glyphs: array<GpuGlyph>;

struct VertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) @interpolate(flat) colour: vec4<f32>,
    @location(1) @interpolate(flat) origin: vec2<f32>,
    @location(2) @interpolate(flat) glyph: u32,
}

@vertex
fn vs_main(@builtin(vertex_index) index: u32, @builtin(instance_index) instance: u32) -> VertexOut {
    let g = glyphs[instance];
    let size = vec2<f32>(5.0, 7.0) * f32(params.label_scale);
    var corners = array<u32, 6>(0u, 1u, 2u, 2u, 1u, 3u);
    let corner = corners[index];
    let px = g.origin.x + select(0.0, size.x, (corner & 1u) != 0u);
    let py = g.origin.y + select(0.0, size.y, (corner & 2u) != 0u);
    let frame = vec2<f32>(params.frame_size);
    var out: VertexOut;
    out.position = vec4<f32>(px / frame.x * 2.0 - 1.0, 1.0 - py / frame.y * 2.0, 0.0, 1.0);
    out.colour = g.colour;
    out.origin = g.origin;
    out.glyph = g.glyph;
    return out;
}

@fragment
fn fs_main(in: VertexOut) -> @location(0) vec4<f32> {
    // Pixel centres are whole + 0.5 and the origin whole: the cell is exact.
    let cell = vec2<u32>(floor((in.position.xy - in.origin) / f32(params.label_scale)));
    if cell.x >= 5u || cell.y >= 7u {
        discard;
    }
    let word = in.glyph * 7u + cell.y;
    let row = params.font[word / 4u][word % 4u];
    if ((row >> (4u - cell.x)) & 1u) == 0u {
        discard;
    }
    return in.colour;
}
