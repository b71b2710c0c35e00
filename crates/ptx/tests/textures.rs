//! Texture and surface instructions (`tex.rs`) in nvcc's forms: `tex` on arrays, pitched and
//! linear memory (point and linear filtering, every address mode, normalized coordinates and
//! normalized-float reads), `tld4`, `txq`/`suq`, `suld.b`/`sust.b` with `.trap/.clamp/.zero`,
//! and a handle the device does not know.

use gpufuse_ptx::{
    AddressMode, ExecError, LaunchConfig, Module, Sampler, Shape, TexFormat, Texture, VecMemory,
};

const BASE: u64 = 0x2000_0000_0000;
/// Where the texture data lives, the coordinates, and the results.
const DATA: u64 = BASE;
const COORDS: u64 = BASE + 0x1000;
const OUT: u64 = BASE + 0x2000;
const HANDLE: u64 = 0x51;

const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64

// out[i] = tex2D<float4>(t, at[i].x, at[i].y), for i < n.
.visible .entry tex2d(.param .u64 t, .param .u64 at, .param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .f32 %f<9>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<9>;
    ld.param.u64 %rd1, [t];
    ld.param.u64 %rd2, [at];
    ld.param.u64 %rd3, [out];
    ld.param.u32 %r2, [n];
    mov.u32 %r1, %tid.x;
    setp.ge.s32 %p1, %r1, %r2;
    @%p1 bra DONE;
    mul.wide.s32 %rd5, %r1, 8;
    add.s64 %rd6, %rd2, %rd5;
    ld.global.v2.f32 {%f1, %f2}, [%rd6];
    tex.2d.v4.f32.f32 {%f5, %f6, %f7, %f8}, [%rd1, {%f1, %f2}];
    mul.wide.s32 %rd7, %r1, 16;
    add.s64 %rd8, %rd3, %rd7;
    st.global.v4.f32 [%rd8], {%f5, %f6, %f7, %f8};
DONE:
    ret;
}

// out[i] = tex1Dfetch<int4>(t, i - 2), for i < n (integer results).
.visible .entry fetch(.param .u64 t, .param .u64 out, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<9>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [t];
    ld.param.u64 %rd2, [out];
    ld.param.u32 %r2, [n];
    mov.u32 %r1, %tid.x;
    setp.ge.s32 %p1, %r1, %r2;
    @%p1 bra DONE;
    sub.s32 %r3, %r1, 2;
    tex.1d.v4.s32.s32 {%r4, %r5, %r6, %r7}, [%rd1, {%r3}];
    mul.wide.s32 %rd3, %r1, 16;
    add.s64 %rd4, %rd2, %rd3;
    st.global.v4.u32 [%rd4], {%r4, %r5, %r6, %r7};
DONE:
    ret;
}

// out = tex2Dgather comp 1 at (at[0].x, at[0].y).
.visible .entry gather(.param .u64 t, .param .u64 at, .param .u64 out)
{
    .reg .f32 %f<9>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [t];
    ld.param.u64 %rd2, [at];
    ld.param.u64 %rd3, [out];
    ld.global.v2.f32 {%f1, %f2}, [%rd2];
    tld4.g.2d.v4.f32.f32 {%f5, %f6, %f7, %f8}, [%rd1, {%f1, %f2}];
    st.global.v4.f32 [%rd3], {%f5, %f6, %f7, %f8};
    ret;
}

// out = {txq.width, txq.height, txq.filter_mode, txq.normalized_coords, suq.width, suq.height}.
.visible .entry queries(.param .u64 t, .param .u64 out)
{
    .reg .b32 %r<7>;
    .reg .b64 %rd<3>;
    ld.param.u64 %rd1, [t];
    ld.param.u64 %rd2, [out];
    txq.width.b32 %r1, [%rd1];
    txq.height.b32 %r2, [%rd1];
    txq.filter_mode.b32 %r3, [%rd1];
    txq.normalized_coords.b32 %r4, [%rd1];
    suq.width.b32 %r5, [%rd1];
    suq.height.b32 %r6, [%rd1];
    st.global.v4.u32 [%rd2], {%r1, %r2, %r3, %r4};
    st.global.v2.u32 [%rd2+16], {%r5, %r6};
    ret;
}

// Thread (x, y) of a w x h block: s[x, y] = x * 100 + y (surf2Dwrite<int>), then
// out[y * w + x] = surf2Dread<int> of its right neighbour (x + 1) in mode .trap/.clamp/.zero.
.visible .entry surf_trap(.param .u64 s, .param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [s];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r1, 100, %r2;
    shl.b32 %r5, %r1, 2;
    sust.b.2d.b32.trap [%rd1, {%r5, %r2}], {%r4};
    bar.sync 0;
    add.s32 %r6, %r5, 4;
    suld.b.2d.b32.trap {%r7}, [%rd1, {%r6, %r2}];
    mad.lo.s32 %r8, %r2, %r3, %r1;
    mul.wide.s32 %rd3, %r8, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r7;
    ret;
}
.visible .entry surf_clamp(.param .u64 s, .param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [s];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r1, 100, %r2;
    shl.b32 %r5, %r1, 2;
    sust.b.2d.b32.trap [%rd1, {%r5, %r2}], {%r4};
    bar.sync 0;
    add.s32 %r6, %r5, 4;
    suld.b.2d.b32.clamp {%r7}, [%rd1, {%r6, %r2}];
    mad.lo.s32 %r8, %r2, %r3, %r1;
    mul.wide.s32 %rd3, %r8, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r7;
    ret;
}
.visible .entry surf_zero(.param .u64 s, .param .u64 out)
{
    .reg .b32 %r<12>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [s];
    ld.param.u64 %rd2, [out];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %tid.y;
    mov.u32 %r3, %ntid.x;
    mad.lo.s32 %r4, %r1, 100, %r2;
    shl.b32 %r5, %r1, 2;
    sust.b.2d.b32.trap [%rd1, {%r5, %r2}], {%r4};
    bar.sync 0;
    add.s32 %r6, %r5, 4;
    suld.b.2d.b32.zero {%r7}, [%rd1, {%r6, %r2}];
    mad.lo.s32 %r8, %r2, %r3, %r1;
    mul.wide.s32 %rd3, %r8, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r7;
    ret;
}

// A uchar4 surface: v = surf2Dread<uchar4>(x * 4, 0); write (w, z, y, x + 1) back.
.visible .entry surf_bytes(.param .u64 s)
{
    .reg .b16 %rs<6>;
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [s];
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 2;
    mov.u32 %r1, 0;
    suld.b.2d.v4.b8.trap {%rs1, %rs2, %rs3, %rs4}, [%rd1, {%r2, %r1}];
    add.s16 %rs5, %rs1, 1;
    sust.b.2d.v4.b8.trap [%rd1, {%r2, %r1}], {%rs4, %rs3, %rs2, %rs5};
    ret;
}
"#;

fn module() -> Module {
    Module::parse(PTX).expect("the texture PTX parses")
}

fn mem() -> VecMemory {
    VecMemory::new(BASE, 0x4000)
}

fn params(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn cfg(block: [u32; 3]) -> LaunchConfig {
    LaunchConfig {
        grid: [1, 1, 1],
        block,
        dynamic_shared_bytes: 0,
    }
}

fn sampler(mode: AddressMode, linear: bool, normalized_coords: bool) -> Sampler {
    Sampler {
        address: [mode; 3],
        linear,
        normalized_float: false,
        normalized_coords,
        border: [0.5, 0.25, 0.0, 1.0],
    }
}

/// A w x h f32 texture of value `10 * y + x` at DATA, rows `pitch` bytes apart.
fn float_texture(m: &mut VecMemory, w: u64, h: u64, pitch: u64, s: Sampler) -> Texture {
    for y in 0..h {
        for x in 0..w {
            let v = (10 * y + x) as f32;
            m.write((y * pitch + 4 * x) as usize, &v.to_le_bytes());
        }
    }
    Texture {
        addr: DATA,
        format: TexFormat::F32,
        channels: 1,
        shape: Shape::D2,
        width: w,
        height: h,
        depth: 1,
        pitch,
        slice: pitch * h,
        sampler: Some(s),
    }
}

/// Samples at `at` and returns the first component of each result.
fn sample(m: &mut VecMemory, t: Texture, at: &[(f32, f32)]) -> Vec<f32> {
    m.set_texture(HANDLE, t);
    let coords: Vec<u8> = at
        .iter()
        .flat_map(|(x, y)| [x.to_le_bytes(), y.to_le_bytes()].concat())
        .collect();
    m.write((COORDS - BASE) as usize, &coords);
    let p = params(&[HANDLE, COORDS, OUT, at.len() as u64]);
    module()
        .launch("tex2d", &cfg([at.len() as u32, 1, 1]), &p, m, &|_| None)
        .expect("tex2d runs");
    let out = m.read((OUT - BASE) as usize, 16 * at.len());
    out.chunks(16)
        .map(|c| f32::from_le_bytes(c[..4].try_into().unwrap()))
        .collect()
}

#[test]
fn point_sampling_unnormalized_clamp_and_border() {
    let mut m = mem();
    let t = float_texture(&mut m, 4, 3, 16, sampler(AddressMode::Clamp, false, false));
    let got = sample(
        &mut m,
        t,
        &[(0.5, 0.5), (3.9, 2.1), (-3.0, 1.5), (9.0, 9.0), (1.0, 2.99)],
    );
    assert_eq!(got, [0.0, 23.0, 10.0, 23.0, 21.0]);
    let t = float_texture(&mut m, 4, 3, 16, sampler(AddressMode::Border, false, false));
    let got = sample(
        &mut m,
        t,
        &[(0.5, 0.5), (-0.1, 0.5), (4.0, 1.0), (3.5, 2.5)],
    );
    assert_eq!(got, [0.0, 0.5, 0.5, 23.0]);
}

#[test]
fn linear_filtering_uses_nine_bit_weights() {
    let mut m = mem();
    let t = float_texture(&mut m, 4, 3, 32, sampler(AddressMode::Clamp, true, false));
    // At a texel centre: the texel. Halfway between x = 1 and 2 (x = 2.0): the mean.
    let got = sample(&mut m, t, &[(1.5, 0.5), (2.0, 0.5), (2.0, 1.0), (0.0, 0.0)]);
    assert_eq!(got, [1.0, 1.5, 6.5, 0.0]);
    // A fraction of 0.3 becomes 77/256 (9-bit fixed point), not 0.3.
    let got = sample(&mut m, t, &[(1.8, 0.5)]);
    assert_eq!(got, [1.0 + 77.0 / 256.0]);
    // Border: the border colour blends in past the edge.
    let t = float_texture(&mut m, 4, 3, 32, sampler(AddressMode::Border, true, false));
    let got = sample(&mut m, t, &[(0.0, 0.5)]);
    assert_eq!(got, [0.5 * 0.5 + 0.5 * 0.0]);
}

#[test]
fn normalized_coordinates_wrap_and_mirror() {
    let mut m = mem();
    let t = float_texture(&mut m, 4, 2, 16, sampler(AddressMode::Wrap, false, true));
    // u = 1.125 wraps to 0.125 (texel 0); -0.125 to 0.875 (texel 3).
    let got = sample(&mut m, t, &[(1.125, 0.25), (-0.125, 0.75), (0.6, 0.5)]);
    assert_eq!(got, [0.0, 13.0, 12.0]);
    let t = float_texture(&mut m, 4, 2, 16, sampler(AddressMode::Mirror, false, true));
    // u = 1.125 mirrors to 0.875 (texel 3); -0.125 to 0.125 (texel 0).
    let got = sample(&mut m, t, &[(1.125, 0.25), (-0.125, 0.25), (2.3, 0.25)]);
    assert_eq!(got, [3.0, 0.0, 1.0]);
    // Linear filtering with wrap blends the last texel with the first.
    let t = float_texture(&mut m, 4, 2, 16, sampler(AddressMode::Wrap, true, true));
    let got = sample(&mut m, t, &[(0.0, 0.25)]);
    assert_eq!(got, [1.5]);
}

#[test]
fn normalized_float_reads_of_bytes() {
    let mut m = mem();
    m.write(0, &[0, 51, 255, 128, 1, 2, 3, 4]);
    let mut s = sampler(AddressMode::Clamp, false, false);
    s.normalized_float = true;
    let t = Texture {
        addr: DATA,
        format: TexFormat::U8,
        channels: 4,
        shape: Shape::D2,
        width: 2,
        height: 1,
        depth: 1,
        pitch: 8,
        slice: 8,
        sampler: Some(s),
    };
    m.set_texture(HANDLE, t);
    m.write(
        (COORDS - BASE) as usize,
        &[0.5f32.to_le_bytes(), 0.5f32.to_le_bytes()].concat(),
    );
    let p = params(&[HANDLE, COORDS, OUT, 1]);
    module()
        .launch("tex2d", &cfg([1, 1, 1]), &p, &m, &|_| None)
        .unwrap();
    let out: Vec<f32> = m
        .read((OUT - BASE) as usize, 16)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(out, [0.0, 0.2, 1.0, 128.0 / 255.0]);
}

#[test]
fn fetch_of_linear_memory_is_zero_out_of_range() {
    let mut m = mem();
    for i in 0..5i32 {
        m.write(
            8 * i as usize,
            &[(-i).to_le_bytes(), (i * 3).to_le_bytes()].concat(),
        );
    }
    let t = Texture {
        addr: DATA,
        format: TexFormat::S32,
        channels: 2,
        shape: Shape::Linear,
        width: 5,
        height: 1,
        depth: 1,
        pitch: 40,
        slice: 40,
        sampler: Some(sampler(AddressMode::Clamp, false, false)),
    };
    m.set_texture(HANDLE, t);
    let p = params(&[HANDLE, OUT, 9]);
    module()
        .launch("fetch", &cfg([9, 1, 1]), &p, &m, &|_| None)
        .unwrap();
    let out: Vec<i32> = m
        .read((OUT - BASE) as usize, 16 * 9)
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    for i in 0..9 {
        let e = i as i32 - 2;
        let want = if (0..5).contains(&e) {
            [-e, 3 * e, 0, 1]
        } else {
            [0; 4]
        };
        assert_eq!(out[4 * i..4 * i + 4], want, "fetch {e}");
    }
}

#[test]
fn gather_returns_one_component_of_four_texels() {
    let mut m = mem();
    // 3x3 float2 texels (x, 100 + x) with x = 10 * row + column.
    for y in 0..3u64 {
        for x in 0..3u64 {
            let v = (10 * y + x) as f32;
            m.write(
                (y * 24 + 8 * x) as usize,
                &[v.to_le_bytes(), (100.0 + v).to_le_bytes()].concat(),
            );
        }
    }
    let t = Texture {
        addr: DATA,
        format: TexFormat::F32,
        channels: 2,
        shape: Shape::D2,
        width: 3,
        height: 3,
        depth: 1,
        pitch: 24,
        slice: 72,
        sampler: Some(sampler(AddressMode::Clamp, false, false)),
    };
    m.set_texture(HANDLE, t);
    m.write(
        (COORDS - BASE) as usize,
        &[1.2f32.to_le_bytes(), 1.7f32.to_le_bytes()].concat(),
    );
    let p = params(&[HANDLE, COORDS, OUT]);
    module()
        .launch("gather", &cfg([1, 1, 1]), &p, &m, &|_| None)
        .unwrap();
    let out: Vec<f32> = m
        .read((OUT - BASE) as usize, 16)
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    // Around (0.7, 1.2): texels (0,1) (1,1) (0,2)... order (i, j+1), (i+1, j+1), (i+1, j), (i, j).
    assert_eq!(out, [120.0, 121.0, 111.0, 110.0]);
}

#[test]
fn queries() {
    let mut m = mem();
    let t = float_texture(&mut m, 7, 5, 28, sampler(AddressMode::Clamp, true, true));
    m.set_texture(HANDLE, t);
    let p = params(&[HANDLE, OUT]);
    module()
        .launch("queries", &cfg([1, 1, 1]), &p, &m, &|_| None)
        .unwrap();
    let out: Vec<u32> = m
        .read((OUT - BASE) as usize, 24)
        .chunks(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(out, [7, 5, 1, 1, 7, 5]);
}

fn int_surface(w: u64, h: u64) -> Texture {
    Texture {
        addr: DATA,
        format: TexFormat::S32,
        channels: 1,
        shape: Shape::D2,
        width: w,
        height: h,
        depth: 1,
        pitch: 4 * w,
        slice: 4 * w * h,
        sampler: None,
    }
}

fn surface_run(kernel: &str) -> Result<Vec<i32>, ExecError> {
    let mut m = mem();
    m.set_texture(HANDLE, int_surface(6, 3));
    let p = params(&[HANDLE, OUT]);
    module().launch(kernel, &cfg([6, 3, 1]), &p, &m, &|_| None)?;
    // The stores landed in the array.
    for y in 0..3 {
        for x in 0..6 {
            let v = m.read(4 * (y * 6 + x), 4);
            assert_eq!(
                i32::from_le_bytes(v.try_into().unwrap()),
                x as i32 * 100 + y as i32
            );
        }
    }
    Ok(m.read((OUT - BASE) as usize, 4 * 18)
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect())
}

#[test]
fn surface_loads_and_stores_with_each_clamp_mode() {
    // The last column reads past the right edge.
    let e = surface_run("surf_trap").unwrap_err();
    assert!(
        matches!(&e, ExecError::Texture(m) if m.contains("out of range")),
        "{e}"
    );
    let clamp = surface_run("surf_clamp").unwrap();
    let zero = surface_run("surf_zero").unwrap();
    for y in 0..3 {
        for x in 0..6 {
            let right = (x + 1).min(5) * 100 + y;
            assert_eq!(clamp[(y * 6 + x) as usize], right, "clamp ({x}, {y})");
            let z = if x == 5 { 0 } else { right };
            assert_eq!(zero[(y * 6 + x) as usize], z, "zero ({x}, {y})");
        }
    }
}

#[test]
fn surface_byte_vectors() {
    let mut m = mem();
    let bytes: Vec<u8> = (0..16).collect();
    m.write(0, &bytes);
    let t = Texture {
        format: TexFormat::U8,
        channels: 4,
        ..int_surface(4, 1)
    };
    m.set_texture(HANDLE, t);
    module()
        .launch(
            "surf_bytes",
            &cfg([4, 1, 1]),
            &params(&[HANDLE]),
            &m,
            &|_| None,
        )
        .unwrap();
    let got = m.read(0, 16);
    for x in 0..4 {
        let b = &bytes[4 * x..4 * x + 4];
        assert_eq!(got[4 * x..4 * x + 4], [b[3], b[2], b[1], b[0] + 1]);
    }
}

#[test]
fn a_handle_the_device_does_not_know_fails_the_launch() {
    let mut m = mem();
    let t = float_texture(&mut m, 4, 3, 16, sampler(AddressMode::Clamp, false, false));
    m.set_texture(HANDLE, t);
    m.remove_texture(HANDLE);
    m.write(
        (COORDS - BASE) as usize,
        &[0.5f32.to_le_bytes(), 0.5f32.to_le_bytes()].concat(),
    );
    let p = params(&[HANDLE, COORDS, OUT, 1]);
    let e = module()
        .launch("tex2d", &cfg([1, 1, 1]), &p, &m, &|_| None)
        .unwrap_err();
    assert!(
        matches!(&e, ExecError::Texture(m) if m.contains("does not exist")),
        "{e}"
    );
    // A surface handle used by `tex` fails too: a surface has no sampler.
    m.set_texture(HANDLE, int_surface(4, 3));
    let e = module()
        .launch("tex2d", &cfg([1, 1, 1]), &p, &m, &|_| None)
        .unwrap_err();
    assert!(matches!(e, ExecError::Texture(_)), "{e}");
}

#[test]
fn forms_the_vm_does_not_run_are_named() {
    for (body, op) in [
        (
            "sust.p.2d.v4.b32.trap [%rd1, {%r1, %r1}], {%r1, %r1, %r1, %r1};",
            "sust",
        ),
        (
            "tex.2d.v4.f32.f32 {%f1, %f1, %f1, %f1}, [tex_ref, {%f1, %f1}];",
            "tex",
        ),
        ("txq.channel_order.b32 %r1, [%rd1];", "txq"),
    ] {
        let src = format!(
            ".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(.param .u64 t)\n{{\n\
             .reg .f32 %f<2>;\n.reg .b32 %r<2>;\n.reg .b64 %rd<2>;\n{body}\nret;\n}}\n"
        );
        let m = Module::parse(&src).expect("parses; the kernel is marked unsupported");
        let (_, why) = m.unsupported().next().expect("kernel k is unsupported");
        assert!(why.contains(op), "{why}");
    }
}
