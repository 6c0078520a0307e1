"""How much of the first token the cue moves, at initialisation: ||e(cue +1) - e(cue -1)|| / ||e(cue +1)|| for the
Dict encoder of the cue task's first observation (8x8x3 image + 3-vector, D 64) and for the vector alone, seeds 0-2.

Run from the repository root: python results/ablations/dict-cue/cue_share.py
"""

import os
import sys

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "tests")]

import cue_task  # noqa: E402
import torch  # noqa: E402

from encoders import make_encoder  # noqa: E402

image = cue_task.step_image(0, 5)[None].transpose(0, 3, 1, 2) / 255.0  # (1, 3, 8, 8), the step's image
with torch.no_grad():
    for seed in range(3):
        torch.manual_seed(seed)
        both, alone = make_encoder({"image": (3, 8, 8), "vector": (3,)}, 64), make_encoder((3,), 64)

        def token(cue: float, encoder: torch.nn.Module) -> torch.Tensor:
            vector = torch.tensor([[[cue, 0.0, 0.0]]])
            if not hasattr(encoder, "parts"):  # the vector alone
                return encoder(vector)
            return encoder({"image": encoder.parts["image"].prepare(image).unsqueeze(1), "vector": vector})

        share = float((token(1.0, both) - token(-1.0, both)).norm() / token(1.0, both).norm())
        share_alone = float((token(1.0, alone) - token(-1.0, alone)).norm() / token(1.0, alone).norm())
        print(f"seed {seed}: dict {share:.2f}, vector alone {share_alone:.2f}")
