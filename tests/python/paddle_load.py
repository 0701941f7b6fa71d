"""Run by the opt-in PaddleNLP test under /work/venv-paddle (paddlepaddle 3.3.1 + paddlenlp 2.8.1):
loads a directory ckpt wrote with PaddleNLP's own from_pretrained, once without any flag (what a
user does; its parameters' dtype recorded) and once with dtype="float32" (as fixtures/paddlenlp/
make_fixtures.py computed Paddle's logits), and saves the fp32 logits on the tokens given.

    python paddle_load.py MODEL_DIR TOKENS.npy OUT.npz
"""
import sys

import numpy as np
import paddle
from paddlenlp.transformers import LlamaForCausalLM


def main():
    model_dir, tokens, out = sys.argv[1:4]
    plain = LlamaForCausalLM.from_pretrained(model_dir)  # no flags
    dtypes = sorted({str(p.dtype) for p in plain.parameters()})
    names = sorted(plain.state_dict().keys())
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype="float32")
    model.eval()
    with paddle.no_grad():
        logits = model(paddle.to_tensor(np.load(tokens)))
        logits = (logits[0] if isinstance(logits, (tuple, list)) else getattr(logits, "logits", logits)).astype("float32").numpy()
    np.savez(out, logits=logits, dtypes=np.array(dtypes), names=np.array(names))


if __name__ == "__main__":
    main()
