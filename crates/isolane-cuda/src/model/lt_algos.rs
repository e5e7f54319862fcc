//! cuBLASLt's algorithms beyond the few its heuristic proposes: `mm_index`'s fallback when every
//! heuristic candidate computed a matmul wrong. Seen on the H200 as an MPS client with 30 or 40 %
//! of the threads (session 28): all eight fp16/bf16 candidates of vit_b_16's Linears wrote inf
//! or wrong tiles. cuBLASLt lists every algorithm id of a type combination
//! (`cublasLtMatmulAlgoGetIds`); each id is tried at up to three of the tiles it offers (its own
//! choice where it offers none), with the first of its stages that cuBLASLt accepts for these
//! descriptors (`cublasLtMatmulAlgoCheck`) and its own cluster shape. The caller checks each
//! against the CPU, as it does the heuristic's candidates.

use super::*;

/// The types a matmul's algorithms are listed for.
pub(super) struct AlgoTypes {
    pub compute: lt::cublasComputeType_t,
    pub scale: lt::cudaDataType,
    pub data: lt::cudaDataType,
}

/// How many ids are asked for, and how many tiles of one id are tried: enough to reach past
/// the clustered Hopper kernels the heuristic prefers, few enough that checking each against
/// the CPU stays a fraction of a build.
const MAX_IDS: usize = 256;
const TILES_PER_ID: usize = 3;

/// What [`listed_algos`] found: how many algorithm ids cuBLASLt lists for the types, and the
/// algorithms (with their workspace) it accepts for the descriptors.
pub(super) struct Listed {
    pub ids: usize,
    pub algos: Vec<(lt::cublasLtMatmulAlgo_t, usize)>,
}

/// Algorithms (with their workspace) cuBLASLt accepts for `descs` within `ws_cap`, at most
/// `limit`, in id order, each id at up to [`TILES_PER_ID`] of its tiles spread over its list.
pub(super) fn listed_algos(
    handle: lt::cublasLtHandle_t,
    descs: crate::handles::LtMatmulDescs,
    types: &AlgoTypes,
    ws_cap: usize,
    limit: usize,
) -> Result<Listed> {
    let mut ids = vec![0i32; MAX_IDS];
    let mut got = 0i32;
    // SAFETY: `ids` holds MAX_IDS elements, the count passed; `got` is a valid out-pointer.
    lt_check("cublasLtMatmulAlgoGetIds", unsafe {
        lt::cublasLtMatmulAlgoGetIds(
            handle,
            types.compute,
            types.scale,
            types.data,
            types.data,
            types.data,
            types.data,
            MAX_IDS as i32,
            ids.as_mut_ptr(),
            &mut got,
        )
    })?;
    ids.truncate(got.clamp(0, MAX_IDS as i32) as usize);
    // The header promises no order; ascending ids make the choice the same on every build.
    ids.sort_unstable();
    let mut out = Listed {
        ids: ids.len(),
        algos: Vec::new(),
    };
    for id in ids {
        let mut algo = lt::cublasLtMatmulAlgo_t { data: [0; 8] };
        // SAFETY: `algo` is a valid out-pointer; the id came from AlgoGetIds for these types.
        let init = unsafe {
            lt::cublasLtMatmulAlgoInit(
                handle,
                types.compute,
                types.scale,
                types.data,
                types.data,
                types.data,
                types.data,
                id,
                &mut algo,
            )
        };
        if init != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            continue;
        }
        let mut tiles = cap_list(
            &algo,
            lt::cublasLtMatmulAlgoCapAttributes_t::CUBLASLT_ALGO_CAP_TILE_IDS,
        );
        if tiles.is_empty() {
            // An algorithm without tile ids (CUBLASLT_MATMUL_TILE_UNDEFINED): its own.
            tiles.push(0);
        }
        let stages = cap_list(
            &algo,
            lt::cublasLtMatmulAlgoCapAttributes_t::CUBLASLT_ALGO_CAP_STAGES_IDS,
        );
        for tile in spread(&tiles, TILES_PER_ID) {
            if let Some(found) = accepted(handle, descs, algo, tile, &stages, ws_cap) {
                out.algos.push(found);
                if out.algos.len() >= limit {
                    return Ok(out);
                }
            }
        }
    }
    Ok(out)
}

/// `algo` at `tile` (0: left undefined, cuBLASLt's own), with the first of its `stages` (or
/// none set) that AlgoCheck accepts within `ws_cap`. The cluster shape is left at cuBLASLt's
/// own choice, as the H200's right algorithms under MPS had it (session 29).
fn accepted(
    handle: lt::cublasLtHandle_t,
    descs: crate::handles::LtMatmulDescs,
    mut algo: lt::cublasLtMatmulAlgo_t,
    tile: u32,
    stages: &[u32],
    ws_cap: usize,
) -> Option<(lt::cublasLtMatmulAlgo_t, usize)> {
    use lt::cublasLtMatmulAlgoConfigAttributes_t as cfg;
    if tile != 0 {
        set_config(&mut algo, cfg::CUBLASLT_ALGO_CONFIG_TILE_ID, tile).ok()?;
    }
    let stage_choices: Vec<Option<u32>> = if stages.is_empty() {
        vec![None]
    } else {
        stages.iter().map(|&s| Some(s)).collect()
    };
    for stage in &stage_choices {
        if let Some(s) = stage {
            if set_config(&mut algo, cfg::CUBLASLT_ALGO_CONFIG_STAGES_ID, *s).is_err() {
                continue;
            }
        }
        match crate::handles::algo_workspace(handle, descs, &algo) {
            Ok(ws) if ws <= ws_cap => return Some((algo, ws)),
            _ => {}
        }
    }
    None
}

/// At most `n` of `items`, spread from first to last (all of them when there are no more).
fn spread(items: &[u32], n: usize) -> Vec<u32> {
    if items.len() <= n || n < 2 {
        return items.iter().take(n).copied().collect();
    }
    (0..n)
        .map(|i| items[i * (items.len() - 1) / (n - 1)])
        .collect()
}

fn set_config(
    algo: &mut lt::cublasLtMatmulAlgo_t,
    attr: lt::cublasLtMatmulAlgoConfigAttributes_t,
    value: u32,
) -> Result<()> {
    // SAFETY: a u32 buffer of the size passed; the attributes set here (TILE_ID, STAGES_ID)
    // are uint32_t in cublasLt.h.
    lt_check("cublasLtMatmulAlgoConfigSetAttribute", unsafe {
        lt::cublasLtMatmulAlgoConfigSetAttribute(
            algo,
            attr,
            &value as *const u32 as *const c_void,
            std::mem::size_of::<u32>(),
        )
    })
}

/// A capability that is a list of u32 ids (TILE_IDS, STAGES_IDS); empty where it cannot be read.
fn cap_list(
    algo: &lt::cublasLtMatmulAlgo_t,
    attr: lt::cublasLtMatmulAlgoCapAttributes_t,
) -> Vec<u32> {
    let mut bytes = 0usize;
    // SAFETY: a size query: no buffer, size 0, the size written to `bytes`.
    let r = unsafe {
        lt::cublasLtMatmulAlgoCapGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut bytes)
    };
    if r != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS || bytes == 0 {
        return Vec::new();
    }
    let mut ids = vec![0u32; bytes / std::mem::size_of::<u32>()];
    let mut written = 0usize;
    // SAFETY: `ids` holds `bytes` bytes, the size passed.
    let r = unsafe {
        lt::cublasLtMatmulAlgoCapGetAttribute(
            algo,
            attr,
            ids.as_mut_ptr() as *mut c_void,
            ids.len() * std::mem::size_of::<u32>(),
            &mut written,
        )
    };
    if r != lt::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Vec::new();
    }
    ids.truncate(written / std::mem::size_of::<u32>());
    // Tile and stage id 0 is "undefined": cuBLASLt's own choice, which AlgoCheck refuses.
    ids.retain(|&t| t != 0);
    ids
}

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn tiles_are_spread_from_first_to_last() {
        assert_eq!(spread(&[1, 2, 3, 4, 5, 6, 7], 3), vec![1, 4, 7]);
        assert_eq!(spread(&[5, 9], 3), vec![5, 9]);
        assert_eq!(spread(&[], 3), Vec::<u32>::new());
        assert_eq!(spread(&[1, 2, 3], 1), vec![1]);
    }
}
