//! PLACEHOLDER: the exact tests are being written here.
