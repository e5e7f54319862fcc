"""The conformance suite's models: name -> how to build it (random weights, eval mode) and its
input size. Every model returns one tensor (see `OneOutput`): classifiers their logits,
segmentation models their "out" map, detection backbones their feature maps flattened and
concatenated (so every level, FPN included, is compared).

Groups (for `--models`): torchvision classification, segmentation, detection backbones, timm,
and yolov8n when Ultralytics is installed.
"""

from collections import OrderedDict

import torch

# torchvision classification models (input 224 unless INPUT says otherwise).
TV_CLASSIFICATION = [
    "resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2",
    "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large",
    "efficientnet_b0", "efficientnet_v2_s",
    "regnet_x_400mf", "regnet_y_400mf",
    "densenet121", "googlenet", "inception_v3",
    "shufflenet_v2_x1_0", "squeezenet1_0", "squeezenet1_1",
    "mnasnet0_5", "mnasnet1_0",
    "convnext_tiny", "vit_b_16", "swin_t", "swin_v2_t", "maxvit_t", "alexnet",
]
TV_SEGMENTATION = [
    "fcn_resnet50", "deeplabv3_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large",
]
TV_DETECTION_BACKBONES = [
    "fasterrcnn_mobilenet_v3_large_fpn.backbone",
    "retinanet_resnet50_fpn.backbone",
    "ssdlite320_mobilenet_v3_large.backbone",
]
TIMM = [
    "timm/resnet26d", "timm/efficientnet_b0", "timm/tf_efficientnet_b0", "timm/mobilenetv3_large_100",
    "timm/vit_tiny_patch16_224", "timm/deit_tiny_patch16_224", "timm/regnety_002",
    "timm/levit_128s", "timm/poolformer_s12", "timm/ghostnet_100", "timm/rexnet_100",
    "timm/convnext_atto", "timm/mixer_s16_224", "timm/dla34", "timm/repvgg_a0",
    "timm/mobilevit_xxs", "timm/edgenext_xx_small", "timm/fastvit_t8",
    # BatchNormalization in training mode over the weights (ScaledStdConv2d), and Tile (XCiT).
    "timm/nf_resnet26", "timm/xcit_nano_12_p16_224",
]
# torchvision's video classifiers: 3-D Conv and pooling, input [1, 3, 8, 112, 112].
TV_VIDEO = ["r3d_18", "mc3_18", "r2plus1d_18"]
OTHER = ["yolov8n"]

ALL = TV_CLASSIFICATION + TV_SEGMENTATION + TV_DETECTION_BACKBONES + TIMM + TV_VIDEO + OTHER
GROUPS = {
    "all": ALL,
    "torchvision": TV_CLASSIFICATION,
    "segmentation": TV_SEGMENTATION,
    "detection": TV_DETECTION_BACKBONES,
    "timm": TIMM,
    "video": TV_VIDEO,
    "other": OTHER,
    # Exported again at opsets 11 and 12 (--exporters classic11,classic12): older exports.
    "opsets": [
        "resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0",
        "regnet_y_400mf", "densenet121", "googlenet", "inception_v3", "shufflenet_v2_x1_0",
        "squeezenet1_1", "mnasnet1_0", "convnext_tiny", "alexnet", "vit_b_16", "swin_t",
        "lraspp_mobilenet_v3_large", "fcn_resnet50", "r3d_18", "timm/resnet26d",
    ],
    # Exported at opsets 9 and 10 and converted down to 10-7 (--exporters classic9,classic10,
    # convert10,convert9,convert8,convert7): the ONNX Model Zoo's era. The segmenters bring
    # Upsample (from Resize), tf_efficientnet_b0 Pad (TF "SAME"), mobilenet_v2 Clip, swin_t
    # Pad and the attribute form of Slice (its windows' roll).
    "oldopsets": [
        "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "densenet121",
        "googlenet", "inception_v3", "shufflenet_v2_x1_0", "squeezenet1_1", "convnext_tiny",
        "vit_b_16", "fcn_resnet50", "lraspp_mobilenet_v3_large", "timm/tf_efficientnet_b0",
        "deeplabv3_mobilenet_v3_large", "swin_t", "alexnet", "timm/resnet26d",
    ],
    # A quick, CPU-friendly subset (small models of every kind).
    "small": [
        "resnet18", "mobilenet_v3_small", "densenet121", "squeezenet1_1", "shufflenet_v2_x1_0",
        "mnasnet0_5", "regnet_x_400mf", "efficientnet_b0", "lraspp_mobilenet_v3_large",
        "timm/vit_tiny_patch16_224", "timm/levit_128s", "timm/poolformer_s12",
    ],
}

INPUT = {
    "inception_v3": 299,
    "fcn_resnet50": 256,
    "deeplabv3_resnet50": 256,
    "deeplabv3_mobilenet_v3_large": 256,
    "lraspp_mobilenet_v3_large": 256,
    "ssdlite320_mobilenet_v3_large.backbone": 320,
    "timm/mobilevit_xxs": 256,
    "timm/fastvit_t8": 256,
    "timm/edgenext_xx_small": 256,
    "yolov8n": 640,
}


class OneOutput(torch.nn.Module):
    """One output tensor: a dict's "out" (segmentation), the first element of a tuple/list
    (Ultralytics' Detect, GoogLeNet/Inception named tuples), or feature maps flattened and
    concatenated (backbones returning an OrderedDict or a list of levels)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        y = self.m(x)
        if isinstance(y, (dict, OrderedDict)):
            if "out" in y:
                return y["out"]
            return torch.cat([v.flatten(1) for v in y.values()], 1)
        if isinstance(y, (tuple, list)):
            if all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in y) and len(y) > 1:
                return torch.cat([t.flatten(1) for t in y], 1)
            return y[0]
        return y


def is_classifier(name):
    return name in TV_CLASSIFICATION or name in TIMM or name in TV_VIDEO


def input_size(name):
    return INPUT.get(name, 224)


def input_shape(name):
    """The input of one sample: [1, 3, S, S], or [1, 3, T, H, W] for a video model."""
    if name in TV_VIDEO:
        return (1, 3, 8, 112, 112)
    return (1, 3, input_size(name), input_size(name))


def build(name):
    """The model in eval mode with its own random initialisation (no download)."""
    import torchvision

    if name == "yolov8n":
        from ultralytics.nn.tasks import DetectionModel

        return DetectionModel("yolov8n.yaml", nc=80, verbose=False).eval()
    if name.startswith("timm/"):
        import timm

        return timm.create_model(name[len("timm/"):], pretrained=False).eval()
    if name.endswith(".backbone"):
        det = torchvision.models.get_model(
            name[: -len(".backbone")], weights=None, weights_backbone=None
        )
        return det.backbone.eval()
    kwargs = {"weights": None}
    if name in TV_SEGMENTATION:
        kwargs.update(weights_backbone=None, aux_loss=False)
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    return torchvision.models.get_model(name, **kwargs).eval()


def expand(spec):
    """`--models` values: group names and model names, comma-separated."""
    out = []
    for part in [p for p in spec.split(",") if p]:
        names = GROUPS.get(part, [part])
        for n in names:
            if n not in ALL:
                raise SystemExit(f"unknown model {n!r}; models: {', '.join(ALL)}; groups: {', '.join(GROUPS)}")
            if n not in out:
                out.append(n)
    return out
