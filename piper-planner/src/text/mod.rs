//! Text for training: Hugging Face tokenizers, and training a byte-level BPE of one's own.

pub mod bpe;
pub mod tokenizer;

pub use bpe::train_byte_level_bpe;
pub use tokenizer::{TOKENIZER_FILE, TextTokenizer};
