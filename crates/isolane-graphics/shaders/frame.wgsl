// The frame as a full-screen triangle (covers the target; cheaper than two triangles), with the
// class mask blended over it.

struct Params {
    frame_size: vec2<u32>,
    mask_size: vec2<u32>,
    mask_alpha: f32,
    has_mask: u32,
    line_width: f32,
    label_scale: u32,
    // Colour of each class; class 0 is background and never drawn.
    palette: array<vec4<f32>, 256>,
    font: array<vec4<u32>, 21>,
}

@group(0) @binding(0) var frame_tex: texture_2d<f32>;
@group(0) @binding(1) var frame_sampler: sampler;
@group(0) @binding(2) var mask_tex: texture_2d<u32>;
@group(0) @binding(3) var<uniform> params: Params;

struct VertexOut {
    @builtin(position) position: vec4<f32>,
    @location(0) uv: vec2<f32>,
}

@vertex
fn vs_main(@builtin(vertex_index) index: u32) -> VertexOut {
    // Vertices (-1,1), (3,1), (-1,-3): a triangle whose inside is the whole clip square.
    let x = f32((index & 1u) * 4u) - 1.0;
    let y = 1.0 - f32((index >> 1u) * 4u);
    var out: VertexOut;
    out.position = vec4<f32>(x, y, 0.0, 1.0);
    // uv (0,0) is the frame's first pixel, top left.
    out.uv = vec2<f32>((x + 1.0) * 0.5, (1.0 - y) * 0.5);
    return out;
}

@fragment
fn fs_main(in: VertexOut) -> @location(0) vec4<f32> {
    let frame = textureSample(frame_tex, frame_sampler, in.uv);
    if params.has_mask == 0u {
        return frame;
    }
    // Nearest-neighbour scaling of the mask to the frame, in integers so that every device
    // picks the same mask pixel: mask x = x * mask_width / frame_width.
    let pixel = vec2<u32>(in.position.xy);
    let at = min(pixel * params.mask_size / params.frame_size, params.mask_size - vec2<u32>(1u));
    let label = textureLoad(mask_tex, at, 0).r;
    if label == 0u {
        return frame;
    }
    let colour = params.palette[label & 255u].rgb;
    return vec4<f32>(mix(frame.rgb, colour, params.mask_alpha), frame.a);
}
