#!/usr/bin/env python3
"""All-reduce bus bandwidth through torch.distributed (NCCL backend), one GPU per process, started by torchrun
on every node: the nccl_tests role's alternative to all_reduce_perf under mpirun.

nccl-tests forms its communicator through MPI only, so torchrun cannot start all_reduce_perf across nodes. This
script measures the same quantity with the NCCL that torch loads (the nvidia-nccl-cu13 wheel vLLM uses, not the
libnccl2 deb) and prints it in all_reduce_perf's layout (header, rank lines, table, footer), so the role reads
both with one parser. torch has no out-of-place all-reduce: only the in-place columns are filled.

Usage (the role renders it): torchrun --nnodes N --nproc-per-node G --node-rank K --master-addr A
--master-port P kimi_allreduce_bench.py -b 1M -e 4G -f 2 -n 20 -w 5 -c 1
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

PROGRAM = "kimi_allreduce_bench"
_SCALE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """8, 128K, 1M, 4G (powers of 1024), as all_reduce_perf reads -b and -e."""
    text = text.strip()
    scale = _SCALE.get(text[-1:].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Every size from min to max, multiplied by factor each step (the last one may stop short of max)."""
    found, size = [], max(min_bytes, 4)
    while size <= max_bytes:
        found.append(size)
        size *= factor
    return found


def bus_factor(nranks: int) -> float:
    """busbw = algbw x 2(n-1)/n for all-reduce: what each rank's links carry, comparable across rank counts."""
    return 2.0 * (nranks - 1) / nranks if nranks > 1 else 0.0


def fit(value: float, width: int) -> str:
    """A number in at most width characters: two decimals, fewer when it would not fit, then an exponent."""
    for text in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def result_columns(time_us: float, algbw: float, busbw: float, wrong: int | None) -> str:
    # all_reduce_perf prints #wrong with %6g, and N/A when the data check is off.
    wrong_text = "    N/A" if wrong is None else f"  {float(wrong):6g}"
    return f"  {fit(time_us, 7)}  {fit(algbw, 6)}  {fit(busbw, 6)}{wrong_text}"


def row_line(size: int, count: int, time_us: float, algbw: float, busbw: float, wrong: int | None) -> str:
    """One table row: the out-of-place group blank, the in-place group filled."""
    preamble = f"{size:12d}  {count:12d}  {'float':>8}  {'sum':>6}  {-1:6d}"
    return preamble + " " * 32 + result_columns(time_us, algbw, busbw, wrong)


def rank_line(rank: int, pid: int, host: str, device: int, bus_id: str, name: str) -> str:
    return f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {device:2d} [{bus_id}] {name}"


def header_lines(args: argparse.Namespace, library_code: int, torch_version: str) -> list[str]:
    return [
        f"# {PROGRAM} torch {torch_version} nccl-library={library_code}",
        f"# Collective test starting: {PROGRAM}",
        f"# nThread 1 nGpus 1 minBytes {parse_size(args.minbytes)} maxBytes {parse_size(args.maxbytes)} "
        f"step: {args.stepfactor}(factor) warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: 1 "
        f"validation: {1 if args.check else 0} graph: 0",
        "#",
        "# Using devices",
    ]


def table_header() -> list[str]:
    blank = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
    return [
        "#",
        blank + "           out-of-place                       in-place          ",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        + "  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}".format(
            "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"
        ),
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        + "  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}".format(
            "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        ),
    ]


def footer_lines(out_of_bounds: int, avg_busbw: float) -> list[str]:
    return [
        f"# {'Out of bounds values':<20} : {out_of_bounds} {'FAILED' if out_of_bounds else 'OK'}",
        f"# {'Avg bus bandwidth':<20} : {avg_busbw:g} ",
        "#",
        f"# Collective test concluded: {PROGRAM}",
        "#",
    ]


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROGRAM, description="all-reduce bus bandwidth with torch.distributed")
    parser.add_argument("-b", "--minbytes", default="32M")
    parser.add_argument("-e", "--maxbytes", default="32M")
    parser.add_argument("-f", "--stepfactor", type=int, default=2)
    parser.add_argument("-n", "--iters", type=int, default=20)
    parser.add_argument("-w", "--warmup_iters", type=int, default=5)
    parser.add_argument("-c", "--check", type=int, default=1)
    return parser.parse_args(argv)


def _bus_id(props: object) -> str:
    domain = getattr(props, "pci_domain_id", 0)
    bus = getattr(props, "pci_bus_id", 0)
    device = getattr(props, "pci_device_id", 0)
    return f"{domain:04x}:{bus:02x}:{device:02x}"


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    import torch
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    props = torch.cuda.get_device_properties(local)
    info = (rank, os.getpid(), socket.gethostname(), local, _bus_id(props), props.name)
    infos: list = [None] * world
    dist.all_gather_object(infos, info)
    major, minor, patch = torch.cuda.nccl.version()
    if rank == 0:
        lines = header_lines(args, major * 10000 + minor * 100 + patch, torch.__version__)
        lines += [rank_line(*item) for item in infos]
        print("\n".join(lines + table_header()), flush=True)

    factor, expected = bus_factor(world), float(world * (world + 1) // 2)
    busbws, failed_sizes = [], 0
    for size in sizes(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor):
        count = size // 4
        buffer = torch.ones(count, dtype=torch.float32, device=device)
        for _ in range(args.warmup_iters):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        dist.barrier(device_ids=[local])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(buffer)
        end.record()
        torch.cuda.synchronize()
        # The time every rank saw, averaged over ranks (all_reduce_perf's default, -a 1).
        seconds = torch.tensor([start.elapsed_time(end) / 1e3 / args.iters], dtype=torch.float64, device=device)
        dist.all_reduce(seconds)
        sec = seconds.item() / world
        wrong: int | None = None
        if args.check:
            wrong_count = torch.zeros(1, dtype=torch.int64, device=device)
            for _ in range(args.check):
                buffer.fill_(rank + 1)
                dist.all_reduce(buffer)
                wrong_count += (buffer != expected).sum()
            dist.all_reduce(wrong_count)
            wrong = int(wrong_count.item())
            failed_sizes += 1 if wrong else 0
        algbw = count * 4 / 1e9 / sec
        busbws.append(algbw * factor)
        if rank == 0:
            print(row_line(count * 4, count, sec * 1e6, algbw, algbw * factor, wrong), flush=True)
        del buffer
    if rank == 0:
        print("\n".join(footer_lines(failed_sizes, sum(busbws) / max(len(busbws), 1))), flush=True)
    dist.destroy_process_group()
    return 1 if failed_sizes else 0


if __name__ == "__main__":
    sys.exit(main())
