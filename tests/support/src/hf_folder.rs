//! Hugging Face model folders made from the transformers fixtures, as `save_pretrained` writes them:
//! `config.json` with the weights in one f32 `model.safetensors`, or in BF16 shards with a
//! `model.safetensors.index.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

/// The fixtures of a transformers version: "" (4.57.1) or "transformers5" (5.24.0).
pub const V4: &str = "";
pub const V5: &str = "transformers5";

/// A fresh model folder (under the temporary folder, named by `test` and this process) from the fixture
/// `name` of `version`: its config and its model weights (the `weight.` tensors) times `scale`, f32 in
/// one file or BF16 in two shards with an index.
pub fn hf_folder(version: &str, name: &str, bf16: bool, test: &str, scale: f32) -> PathBuf {
    let fixtures = crate::fixtures().join(version);
    let dir = std::env::temp_dir().join(format!("piper-hf-{test}-{version}{name}-{bf16}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixtures.join(format!("hf_{name}_config.json")), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(fixtures.join(format!("hf_{name}.safetensors"))).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    // Sorted by name, as save_pretrained orders them.
    let mut weights: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (name, view) in st.tensors() {
        let Some(name) = name.strip_prefix("weight.") else { continue };
        assert_eq!(view.dtype(), Dtype::F32, "{name}: the fixtures are f32");
        let values = view.data().chunks_exact(4).map(|c| scale * f32::from_le_bytes(c.try_into().unwrap()));
        let encoded: Vec<u8> = if bf16 {
            values.flat_map(|x| bf16_bits(x).to_le_bytes()).collect()
        } else {
            values.flat_map(|x| x.to_le_bytes()).collect()
        };
        weights.insert(name.to_string(), (view.shape().to_vec(), encoded));
    }
    let dtype = if bf16 { Dtype::BF16 } else { Dtype::F32 };
    /// A tensor's name, then its shape and encoded bytes.
    type Entry<'a> = (&'a String, &'a (Vec<usize>, Vec<u8>));
    let write = |file: &str, part: &[Entry]| {
        let views: Vec<(String, TensorView)> =
            part.iter().map(|(n, (s, b))| (n.to_string(), TensorView::new(dtype, s.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &dir.join(file)).unwrap();
    };
    let all: Vec<_> = weights.iter().collect();
    if bf16 {
        let half = all.len() / 2;
        let files = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
        write(files[0], &all[..half]);
        write(files[1], &all[half..]);
        let map: BTreeMap<&String, &str> =
            all.iter().enumerate().map(|(i, (n, _))| (*n, files[usize::from(i >= half)])).collect();
        let index = serde_json::json!({"metadata": {}, "weight_map": map});
        std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    } else {
        write("model.safetensors", &all);
    }
    dir
}

/// f32 → bf16 bits, rounding to nearest even (as torch does).
pub fn bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7fff + ((b >> 16) & 1)) >> 16) as u16
}
