//! Pod metadata from the Kubernetes API (being written).
