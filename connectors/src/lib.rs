//! grflow-connectors
