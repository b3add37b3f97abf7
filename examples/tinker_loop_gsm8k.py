"""Seed 000's Tinker RL loop on GSM8K, run on strop.

Compared with the notebook, only the imports, the client construction and the dataset loader changed
(and the Snowflake/Cortex parts are left out: strop's own evaluation covers them). The loop body, the
grading utilities and the evaluation are the notebook's, line for line.

    python examples/tinker_loop_gsm8k.py                       # strop/tiny-random, a smoke run
    python examples/tinker_loop_gsm8k.py --smollm2             # the real SmolLM2-135M-Instruct
    python examples/tinker_loop_gsm8k.py --data-dir ../shared/data/gsm8k --steps 2
"""

import argparse
import re
import time

import torch

# --- changed: strop in place of tinker / tinker_cookbook / datasets -------------------------------------------
import strop as tinker
from strop import model_info, renderers, types
from strop.data import load_dataset
from strop.tokenizer_utils import get_tokenizer
from strop.types import TensorData

cli = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
cli.add_argument("--smollm2", action="store_true", help="use HuggingFaceTB/SmolLM2-135M-Instruct")
cli.add_argument("--model", default=None, help="any base model id (overrides --smollm2)")
cli.add_argument("--data-dir", default=None, help="folder with GSM8K train.jsonl/test.jsonl (default: the hub)")
cli.add_argument("--steps", type=int, default=2)
cli.add_argument("--batch-size", type=int, default=4)
cli.add_argument("--group-size", type=int, default=4)
cli.add_argument("--max-tokens", type=int, default=32)
cli.add_argument("--eval-n", type=int, default=8)
args = cli.parse_args()

TINKER_MODEL = args.model or ("HuggingFaceTB/SmolLM2-135M-Instruct" if args.smollm2 else "strop/tiny-random")
LORA_RANK = 32
LEARNING_RATE = 1e-4
GROUP_SIZE = args.group_size   # rollouts per problem
BATCH_SIZE = args.batch_size   # problems per batch
TRAIN_STEPS = args.steps       # batches to train
MAX_TOKENS = args.max_tokens

ds = load_dataset("openai/gsm8k", "main", data_dir=args.data_dir)
train_data = ds["train"]
test_data = ds["test"].select(range(args.eval_n))
# --- end of changes ---------------------------------------------------------------------------------------------

print(f"Train: {len(train_data)} | Eval: {len(test_data)}")


def extract_gsm8k_answer(answer_text):
    match = re.search(r"####\s*(.+)", answer_text)
    return match.group(1).strip().replace(",", "") if match else ""


def extract_boxed(text):
    match = re.search(r"\\boxed\{([^}]+)\}", text)
    return match.group(1).strip().replace(",", "") if match else ""


def extract_any_number(text):
    numbers = re.findall(r"-?[\d,]+\.?\d*", text)
    return numbers[-1].replace(",", "") if numbers else ""


def grade(response, ground_truth):
    gt = extract_gsm8k_answer(ground_truth)
    pred = extract_boxed(response) or extract_any_number(response)
    try:
        return abs(float(pred) - float(gt)) < 1e-3
    except (ValueError, TypeError):
        return pred.strip() == gt.strip()


assert extract_gsm8k_answer("some work\n#### 42") == "42"
assert extract_boxed("The answer is \\boxed{42}") == "42"

MATH_SYSTEM_PROMPT = (
    "Solve the math problem step by step. "
    "Put your final numerical answer inside \\boxed{}."
)

service_client = tinker.ServiceClient()
training_client = service_client.create_lora_training_client(
    base_model=TINKER_MODEL, rank=LORA_RANK
)
tokenizer = get_tokenizer(TINKER_MODEL)
renderer_name = model_info.get_recommended_renderer_name(TINKER_MODEL)
renderer = renderers.get_renderer(renderer_name, tokenizer)

sampling_params = tinker.types.SamplingParams(
    max_tokens=MAX_TOKENS, stop=renderer.get_stop_sequences(),
)
adam_params = types.AdamParams(
    learning_rate=LEARNING_RATE, beta1=0.9, beta2=0.95, eps=1e-8
)
print(f"Tinker client ready — {TINKER_MODEL}, LoRA rank {LORA_RANK}")

CONVO_PREFIX = [{"role": "system", "content": MATH_SYSTEM_PROMPT}]
QUESTION_SUFFIX = "\nPlease reason step by step and put your final answer in \\boxed{}."
train_metrics = []

for step in range(TRAIN_STEPS):
    t0 = time.time()
    start = step * BATCH_SIZE
    batch = train_data.select(range(start, min(start + BATCH_SIZE, len(train_data))))
    sampling_client = training_client.save_weights_and_get_sampling_client()

    futures, prompts = [], []
    for question in batch["question"]:
        convo = [*CONVO_PREFIX, {"role": "user", "content": question + QUESTION_SUFFIX}]
        mi = renderer.build_generation_prompt(convo)
        futures.append(sampling_client.sample(prompt=mi, num_samples=GROUP_SIZE, sampling_params=sampling_params))
        prompts.append(mi)

    datums, rewards_per_problem = [], []
    for future, prompt, answer in zip(futures, prompts, batch["answer"]):
        result = future.result()
        rewards_g, tokens_g, logprobs_g = [], [], []
        for seq in result.sequences:
            tokens_g.append(seq.tokens); logprobs_g.append(seq.logprobs)
            parsed_msg, _ = renderer.parse_response(seq.tokens)
            content = renderers.get_text_content(parsed_msg)
            gt, pred = extract_gsm8k_answer(answer), extract_boxed(content) or extract_any_number(content)
            try:    reward = 1.0 if abs(float(pred) - float(gt)) < 1e-3 else 0.0
            except: reward = 0.0  # noqa: E722 (the notebook's own line)
            rewards_g.append(reward)

        mean_reward = sum(rewards_g) / len(rewards_g)
        advantages = [r - mean_reward for r in rewards_g]
        rewards_per_problem.append(mean_reward)
        if all(a == 0.0 for a in advantages): continue

        ob_len = prompt.length - 1
        for toks, lps, adv in zip(tokens_g, logprobs_g, advantages):
            mi = prompt.append(types.EncodedTextChunk(tokens=toks[:-1]))
            datums.append(types.Datum(
                model_input=mi,
                loss_fn_inputs={
                    "target_tokens": TensorData.from_torch(torch.tensor([0]*ob_len + toks)),
                    "logprobs":      TensorData.from_torch(torch.tensor([0.0]*ob_len + lps)),
                    "advantages":    TensorData.from_torch(torch.tensor([0.0]*ob_len + [adv]*(mi.length-ob_len))),
                },
            ))

    if datums:
        training_client.forward_backward(datums, loss_fn="importance_sampling").result()
        training_client.optim_step(adam_params).result()

    batch_reward = sum(rewards_per_problem) / len(rewards_per_problem)
    elapsed = time.time() - t0
    train_metrics.append({"step": step, "reward": batch_reward, "time_s": elapsed})
    print(f"Step {step:3d} | reward {batch_reward:.3f} | datums {len(datums):4d} | {elapsed:.1f}s")

print("\nTraining complete")

finetuned_sampler = training_client.save_weights_and_get_sampling_client(name="math-rl-finetuned")

eval_futures = []
for row in test_data:
    convo = [*CONVO_PREFIX, {"role": "user", "content": row["question"] + QUESTION_SUFFIX}]
    mi = renderer.build_generation_prompt(convo)
    eval_futures.append((finetuned_sampler.sample(prompt=mi, num_samples=1, sampling_params=sampling_params), row))

finetuned_results = []
for i, (future, row) in enumerate(eval_futures):
    seq = future.result().sequences[0]
    parsed_msg, _ = renderer.parse_response(seq.tokens)
    response = renderers.get_text_content(parsed_msg)
    finetuned_results.append({
        "idx": i, "question": row["question"][:80],
        "ground_truth": extract_gsm8k_answer(row["answer"]),
        "model_answer": extract_boxed(response) or extract_any_number(response),
        "correct": grade(response, row["answer"]), "response": response,
    })
    if (i + 1) % 10 == 0:
        acc = sum(r["correct"] for r in finetuned_results) / len(finetuned_results)
        print(f"  [{i+1}/{len(test_data)}] running accuracy: {acc:.1%}")

finetuned_acc = sum(r["correct"] for r in finetuned_results) / len(finetuned_results)
print(f"\nFine-tuned {TINKER_MODEL} accuracy: {finetuned_acc:.1%}")
print(f"Adapter saved at {finetuned_sampler.model_path}")
