#!/usr/bin/python3
"""Calls a Specula server's Generation API: Generate (unary) and GenerateStream (streaming).

Uses Debian's python3-grpcio and python3-protobuf with the stubs the build generates from
proto/specula/v1/generation.proto into <build>/python (pass --stubs DIR or put DIR on PYTHONPATH).

    build/bin/specula serve &                     # listens on 127.0.0.1:50051
    /usr/bin/python3 examples/python/generate_client.py --stubs build/python \
        --prompt "import os" --max-new-tokens 64
"""
import argparse
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="127.0.0.1:50051", help="server address (host:port)")
    p.add_argument("--stubs", default=None, help="directory holding specula/v1/*_pb2*.py")
    p.add_argument("--prompt", default="import os\n", help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--drafter", default="", help='"" = server default, "none" = no speculation')
    p.add_argument("--draft-len", type=int, default=0, help="0 = server default")
    p.add_argument("--mode", choices=["both", "unary", "stream"], default="both")
    p.add_argument("--timeout", type=float, default=60.0, help="deadline per call, seconds")
    return p.parse_args()


def build_request(pb, args):
    sampling = pb.SamplingParams(temperature=args.temperature)
    if args.top_p is not None:
        sampling.top_p = args.top_p
    if args.seed is not None:
        sampling.seed = args.seed
    return pb.GenerateRequest(
        text=args.prompt,
        max_new_tokens=args.max_new_tokens,
        sampling=sampling,
        stop=args.stop,
        speculation=pb.Speculation(drafter=args.drafter, max_draft_tokens=args.draft_len),
    )


def describe(pb, finish_reason, usage, spec):
    return (f"[finish: {pb.FinishReason.Name(finish_reason)}, {usage.prompt_tokens} prompt + "
            f"{usage.completion_tokens} generated tokens, drafter {spec.drafter}: "
            f"{spec.accepted_tokens}/{spec.draft_tokens} drafts accepted, "
            f"{spec.mean_accepted_len:.2f} tokens/step{', LOSSY' if spec.lossy else ''}]")


def main():
    args = parse_args()
    if args.stubs:
        sys.path.insert(0, args.stubs)
    import grpc
    from specula.v1 import generation_pb2 as pb
    from specula.v1 import generation_pb2_grpc as pb_grpc

    with grpc.insecure_channel(args.target) as channel:
        stub = pb_grpc.GenerationStub(channel)
        info = stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=args.timeout)
        print(f"# server: model {info.model_name}, drafters {', '.join(info.drafters) or 'none'} "
              f"(default {info.default_drafter})", file=sys.stderr)
        request = build_request(pb, args)
        try:
            if args.mode in ("both", "unary"):
                response = stub.Generate(request, timeout=args.timeout)
                print("== Generate")
                print(response.text)
                print(describe(pb, response.finish_reason, response.usage, response.spec))
            if args.mode in ("both", "stream"):
                print("== GenerateStream")
                for message in stub.GenerateStream(request, timeout=args.timeout):
                    if message.HasField("delta"):
                        print(message.delta.text, end="", flush=True)
                    else:
                        f = message.finished
                        print()
                        print(describe(pb, f.finish_reason, f.usage, f.spec))
        except grpc.RpcError as e:
            print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
