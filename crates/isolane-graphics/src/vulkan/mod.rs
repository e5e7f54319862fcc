//! The Vulkan objects behind the renderer, each owning what it creates.

pub(crate) mod commands;
pub(crate) mod context;
pub(crate) mod memory;
pub(crate) mod pipeline;
