"""``python -m verl.model_merger {merge,test} --local_dir <checkpoint> ...``: verl's merger, on this project's
checkpoints. See docs/after_training.md."""

from __future__ import annotations

import argparse
import sys

from verl.errors import VerlError

EPILOG = """--local_dir takes a run's global_step_N folder, verl's global_step_N/actor (or /critic) spelling of it,
the run folder itself (its newest checkpoint), or upstream verl's own checkpoint folder (its
model_world_size_W_rank_R.pt files). A LoRA run merges into a plain model, its adapter beside it in
lora_adapter/ (--adapter_only: the adapter alone). See docs/after_training.md."""


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m verl.model_merger", epilog=EPILOG,
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   description="Write a training checkpoint as a Hugging Face model folder "
                                               "(merge), or compare it with one (test).")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", default="fsdp", choices=["fsdp", "megatron"],
                        help="the trainer's backend: fsdp (this project trains with FSDP only; megatron is refused)")
    common.add_argument("--local_dir", "--local-dir", required=True,
                        help="the checkpoint: <run>/global_step_N, <run>/global_step_N/actor (or /critic), <run>, "
                             "or upstream verl's global_step_N/actor")
    common.add_argument("--hf_model_path", "--hf-model-path", default=None,
                        help="the model folder the run started from, when it is not where the run's settings say "
                             "(architecture, tokenizer and, for LoRA, the base weights come from it)")
    common.add_argument("--is-value-model", "--is_value_model", dest="value_model", action="store_true",
                        help="merge the critic (also: --local_dir .../critic) as a token-classification model "
                             "with one label")
    common.add_argument("--tie-word-embedding", "--tie_word_embedding", dest="tie_word_embedding",
                        action="store_true", help="check that the model ties its output layer to its embedding "
                                                  "(the tie is the model's own and is kept either way)")
    common.add_argument("--use_cpu_initialization", "--use-cpu-initialization", action="store_true",
                        help="accepted for verl's scripts: the merge always builds the model on the CPU here")
    sub = main.add_subparsers(dest="operation", required=True, metavar="{merge,test}")
    merge = sub.add_parser("merge", parents=[common], help="write the checkpoint as a Hugging Face folder",
                           epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    merge.add_argument("--target_dir", "--target-dir", required=True, help="the folder to write (created; an earlier merge there "
                                                           "is replaced)")
    merge.add_argument("--adapter_only", "--adapter-only", action="store_true",
                       help="a LoRA run: write its adapter alone (a PEFT folder), not the merged model")
    merge.add_argument("--hf_upload_path", "--hf-upload-path", default=None,
                       help="also upload the folder to this Hugging Face repository id (needs a login)")
    merge.add_argument("--private", action="store_true", help="with --hf_upload_path: create the repository private")
    test = sub.add_parser("test", parents=[common], help="merge in memory and compare with a Hugging Face folder",
                          epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    test.add_argument("--test_hf_dir", "--test-hf-dir", required=True, help="the Hugging Face folder to compare with")
    return main


def upload(folder, repo_id: str, private: bool) -> None:
    try:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(repo_id=repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, repo_type="model")
    except Exception as error:  # no login, no network, a repository of someone else: one line
        raise VerlError(f"uploading {folder} to {repo_id} failed ({type(error).__name__}: "
                        f"{(str(error).splitlines() or [''])[0][:200]}); the merged folder is written: upload it "
                        f"later with `huggingface-cli upload {repo_id} {folder}`") from None
    print(f"Uploaded {folder} to https://huggingface.co/{repo_id}", flush=True)


def run(args: argparse.Namespace) -> int:
    from verl.model_merger.merge import MergeRequest, check_against, merge

    if args.backend == "megatron":
        raise VerlError("--backend megatron: this project trains with FSDP only, and its checkpoints merge with "
                        "--backend fsdp (the default)")
    if args.operation == "merge" and args.private and not args.hf_upload_path:
        raise VerlError("--private applies to an upload: give --hf_upload_path <user/repo> too, or drop --private")
    request = MergeRequest(local_dir=args.local_dir, hf_model_path=args.hf_model_path, value_model=args.value_model,
                           tie_word_embedding=args.tie_word_embedding,
                           target_dir=getattr(args, "target_dir", None),
                           adapter_only=getattr(args, "adapter_only", False))
    if args.operation == "test":
        return check_against(request, args.test_hf_dir)
    target = merge(request)
    if args.hf_upload_path:
        upload(target, args.hf_upload_path, args.private)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    import logging
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=os.environ.get("VERL_LOG_LEVEL", "WARNING"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from verl.utils.command import freeze_heap_at_exit

    freeze_heap_at_exit()
    try:
        return run(args)
    except VerlError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from verl.utils.command import run_command

    run_command(main)
