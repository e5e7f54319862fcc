// Box outlines: each box is one instance of 24 vertices, two triangles for each of its four
// edges, each edge a band `line_width` pixels wide inside the box.

struct Params {
    frame_size: vec2<u32>,
    mask_size: vec2<u32>,
    mask_alpha: f32,
    has_mask: u32,
    line_width: f32,
    label_scale: u32,
    palette: array<vec4<f32>, 256>,
    font: array<vec4<u32>, 21>,
}

struct GpuBox {
    // x0, y0, x1, y1 in pixels of the frame, (0, 0) its top-left corner.
    rect: vec4<f32>,
    colour: vec4<f32>,
}

@group(0) @binding(3) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> boxes: array<GpuBox>;

struct VertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) @interpolate(flat) colour: vec4<f32>,
}

// The edge band `edge` (0 top, 1 bottom, 2 left, 3 right) of `rect`, as x0, y0, x1, y1.
fn edge_rect(rect: vec4<f32>, edge: u32, width: f32) -> vec4<f32> {
    let w = min(width, 0.5 * min(rect.z - rect.x, rect.w - rect.y));
    switch edge {
        case 0u: { return vec4<f32>(rect.x, rect.y, rect.z, rect.y + w); }
        case 1u: { return vec4<f32>(rect.x, rect.w - w, rect.z, rect.w); }
        case 2u: { return vec4<f32>(rect.x, rect.y, rect.x + w, rect.w); }
        default: { return vec4<f32>(rect.z - w, rect.y, rect.z, rect.w); }
    }
}

@vertex
fn vs_main(@builtin(vertex_index) index: u32, @builtin(instance_index) instance: u32) -> VertexOut {
    let b = boxes[instance];
    let r = edge_rect(b.rect, index / 6u, params.line_width);
    // Corners of the two triangles (0,1,2) and (2,1,3) of a quad: bit 0 picks x1, bit 1 picks y1.
    var corners = array<u32, 6>(0u, 1u, 2u, 2u, 1u, 3u);
    let corner = corners[index % 6u];
    let px = select(r.x, r.z, (corner & 1u) != 0u);
    let py = select(r.y, r.w, (corner & 2u) != 0u);
    let size = vec2<f32>(params.frame_size);
    var out: VertexOut;
    out.position = vec4<f32>(px / size.x * 2.0 - 1.0, 1.0 - py / size.y * 2.0, 0.0, 1.0);
    out.colour = b.colour;
    return out;
}

@fragment
fn fs_main(in: VertexOut) -> @location(0) vec4<f32> {
    return in.colour;
}
