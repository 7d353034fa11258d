//! grflow-pipeline
