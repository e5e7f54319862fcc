//! Class names for classifier outputs.
//!
//! `imagenet_classes.txt` is torchvision's `weights.meta["categories"]` for the ImageNet-1k
//! classifiers (one name a line, index order), written by `tools/reference/export.py --classes`.

const IMAGENET: &str = include_str!("imagenet_classes.txt");

/// The 1000 ImageNet-1k class names in index order, if the embedded list is complete.
pub fn imagenet_classes() -> Option<Vec<&'static str>> {
    let names: Vec<&str> = IMAGENET.lines().map(str::trim_end).collect();
    (names.len() == 1000).then_some(names)
}
