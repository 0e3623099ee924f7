//! Config spellings across transformers versions: the config.json transformers 5.24.0 saves for each MoE
//! family the planner reads (`tests/fixtures/make_hf_configs.py`: each family's default config, i.e. its
//! reference model), read by the planner's loader, gives the numbers transformers itself reports for it
//! through its attribute maps (`*.expected.json`, written by the same script).

use piper_planner::model::presets::load_model_str;
use serde_json::Value;

const FAMILIES: [&str; 9] =
    ["mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss", "dbrx", "llama4"];

#[test]
fn every_family_reads_its_transformers_5_config() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/transformers5/configs");
    for family in FAMILIES {
        let text = std::fs::read_to_string(dir.join(format!("{family}.json"))).unwrap();
        let want: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{family}.expected.json"))).unwrap())
                .unwrap();
        assert!(want["transformers"].as_str().unwrap().starts_with("5."), "{family}: {want}");
        let spec = load_model_str(&text, &format!("{family}.json")).unwrap_or_else(|e| panic!("{family}: {e}"));
        let moe = spec.moe.as_ref().unwrap_or_else(|| panic!("{family}: read as a dense model"));
        let got = [
            ("hidden_size", spec.hidden_size),
            ("num_layers", spec.num_layers),
            ("vocab_size", spec.vocab_size),
            ("num_experts", moe.num_experts),
            ("top_k", moe.top_k),
        ];
        for (key, value) in got {
            assert_eq!(Some(value), want[key].as_u64(), "{family}: {key}");
        }
    }
}
