//! The live run against a gateway (to come with the API).
