//! Entry points of the fuzz targets (`spool-tests`, `fuzz/`) into formats
//! the crate keeps private: the log store's index records and values, and
//! the serde reference decoders the hand-written codec is checked against.
//! Feature `fuzzing`; not a stable API.

pub use crate::session::codec::{
    decode_appended_entry_serde, decode_event_serde, decode_snapshot_serde,
};
pub use crate::store::log::sessions::header_record_reencoded;
pub use crate::store::log::transcript::fuzzing::*;
pub use crate::store::log::transcript::{
    encode_seed_bucket, seed_bucket_records, EntryRecord, TranscriptMeta, TRANSCRIPT_INDEXER,
};
