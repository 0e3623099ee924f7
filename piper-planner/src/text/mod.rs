//! Text for training: Hugging Face tokenizers, training a byte-level BPE of one's own, and token shards
//! of large corpora.

pub mod bpe;
pub mod shards;
pub mod tokenizer;

pub use bpe::train_byte_level_bpe;
pub use tokenizer::{TOKENIZER_FILE, TextTokenizer};
