"""mp4 videos of uint8 RGB frames, through the ffmpeg binary of imageio-ffmpeg.

A LeRobot v3 video file holds the frames of several episodes one after another at a constant
frame rate: frame n is at ``n / fps`` seconds, and an episode is the range
``[from_timestamp, to_timestamp)`` of its file. We encode each episode on its own and join a
file's episodes by stream copy (``concat_videos``; the timestamps stay ``n / fps``), and read a
file once, keeping only the frames asked for.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from nets.errors import BadInput
from nets.files import regular_file
from trainers.datasets.extras import ffmpeg_exe

# LeRobot's defaults (its encode_video_frames): AV1 by SVT-AV1, 4:2:0, a key frame every 2 frames
# (cheap random access), constant rate factor 30, fastest preset.
DEFAULT_CODEC = "libsvtav1"
CODEC_OPTIONS = {
    "libsvtav1": ["-preset", "12", "-crf", "30", "-g", "2"],
    "libx264": ["-preset", "medium", "-crf", "18", "-g", "2"],
    "libaom-av1": ["-cpu-used", "8", "-crf", "30", "-g", "2"],
}
CODEC_NAMES = {"libsvtav1": "av1", "libaom-av1": "av1", "libx264": "h264"}  # as ffprobe/PyAV name them


class VideoWriter:
    """Append frames ``[N, H, W, 3]`` uint8 to one mp4 (``close`` finishes it, ``abort`` drops it)."""

    def __init__(
        self, path: str | Path, height: int, width: int, fps: float, codec: str = DEFAULT_CODEC
    ) -> None:
        if codec not in CODEC_OPTIONS:
            raise BadInput(f"video codec must be one of {sorted(CODEC_OPTIONS)}, got {codec!r}")
        if height % 2 or width % 2:
            raise BadInput(
                f"yuv420p videos need an even height and width, got {height}x{width}: "
                "store the images as PNG instead (video=False / --no-video)"
            )
        self.path, self.shape, self.frames = Path(path), (height, width, 3), 0
        self._log = tempfile.TemporaryFile()
        cmd = [ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24"]
        cmd += ["-s", f"{width}x{height}", "-r", str(fps), "-i", "-", "-an", "-c:v", codec]
        cmd += [*CODEC_OPTIONS[codec], "-pix_fmt", "yuv420p", "-f", "mp4", str(self.path)]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._log)

    def write(self, frames: np.ndarray) -> None:
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.shape[1:] != self.shape:
            raise BadInput(
                f"{self.path}: frames must be uint8 [N, *{self.shape}], got {frames.dtype} {frames.shape}"
            )
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(np.ascontiguousarray(frames).tobytes())
        except BrokenPipeError:
            self._fail()
        self.frames += len(frames)

    def close(self) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except BrokenPipeError:
            pass
        if self._proc.wait() != 0:
            self._fail()
        self._log.close()

    def abort(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._log.close()

    def _fail(self) -> None:
        self._proc.kill()
        self._proc.wait()
        self._log.seek(0)
        message = self._log.read().decode(errors="replace").strip()
        self._log.close()
        raise RuntimeError(f"ffmpeg could not encode {self.path}: {message[-2000:]}")


def concat_videos(segments: list[Path], out: str | Path) -> None:
    """Join mp4 files of the same encoding back to back into ``out`` (stream copy, no re-encoding):
    frame n of the result is at ``n / fps``."""
    out = Path(out)
    if len(segments) == 1:
        Path(segments[0]).replace(out)
        return
    listing = out.with_name(out.name + ".concat.txt")
    listing.write_text(
        "".join("file '{}'\n".format(str(Path(p).resolve()).replace("'", "'\\''")) for p in segments)
    )
    cmd = [ffmpeg_exe(), "-y", "-loglevel", "error", "-f", "concat", "-safe", "0", "-i", str(listing)]
    cmd += ["-c", "copy", "-f", "mp4", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    listing.unlink()
    if done.returncode != 0:
        raise RuntimeError(f"ffmpeg could not join {len(segments)} videos into {out}: {done.stderr[-2000:]}")
    for p in segments:
        Path(p).unlink()


def _pam_header(stream: Any, path: Path) -> tuple[int, int, int] | None:
    """The next PAM header of ``stream`` as (height, width, depth); None at the end of the stream."""
    first = stream.readline()
    if not first:
        return None
    fields: dict[str, str] = {}
    line = first
    for _ in range(16):  # P7, WIDTH, HEIGHT, DEPTH, MAXVAL, TUPLTYPE, ENDHDR
        text = line.decode("ascii", errors="replace").strip()
        if text == "ENDHDR":
            break
        key, _, value = text.partition(" ")
        fields[key] = value.strip()
        line = stream.readline()
    else:
        raise RuntimeError(f"ffmpeg gave no readable frame header decoding {path}: {first[:40]!r}")
    try:
        return int(fields["HEIGHT"]), int(fields["WIDTH"]), int(fields["DEPTH"])
    except (KeyError, ValueError):
        raise RuntimeError(f"ffmpeg gave no readable frame header decoding {path}: {fields}") from None


def _cut_short(path: Path) -> str | None:
    """How an mp4 file is cut short, read from its top-level box headers alone (8-16 bytes each):
    a box that runs past the end of the file, or no ``moov`` box (the frame index, which mp4
    writers add last). None when the boxes fill the file and include it, and for a file that does
    not start with an ``ftyp`` box (not an ISO mp4, e.g. another container: ffmpeg judges it)."""
    size, offset, kinds = regular_file(path).stat().st_size, 0, set()
    with open(path, "rb") as f:
        while offset < size:
            f.seek(offset)
            header = f.read(16)
            if offset == 0 and header[4:8] != b"ftyp":
                return None
            if len(header) < 8:
                return f"it ends {len(header)} bytes into the header of a box at byte {offset}"
            length, kind = int.from_bytes(header[:4], "big"), header[4:8]
            if not all(32 <= c < 127 for c in kind):  # not a box header: ffmpeg judges the file
                return None
            if length == 1:  # a 64-bit size follows the type
                if len(header) < 16:
                    return f"it ends inside the header of its {kind.decode()!r} box at byte {offset}"
                length = int.from_bytes(header[8:16], "big")
            elif length == 0:  # the box runs to the end of the file
                length = size - offset
            if length < 8:
                return None
            if offset + length > size:
                return (
                    f"its {kind.decode()!r} box at byte {offset} declares {length} bytes, "
                    f"{offset + length - size} more than the file holds"
                )
            kinds.add(kind)
            offset += length
    if b"moov" not in kinds:
        return "it has no 'moov' box, the index of its frames that mp4 writers add last"
    return None


def read_frames(
    path: str | Path, height: int, width: int, declared: str = "asked for", frames: int | None = None
) -> Iterator[np.ndarray]:
    """Every frame of a video, decoded to uint8 ``[height, width, 3]`` in order (no frame is
    dropped or repeated: the decoder's own timestamps are kept).

    Each decoded frame comes with its own size (ffmpeg writes PAM images, one header per frame), and
    a frame that is not ``height`` x ``width`` is a ValueError naming the file, the size asked for
    (``declared`` says by whom, e.g. "that meta/info.json declares") and the real one: the bytes
    of a larger frame are never read as several smaller ones. An mp4 file cut short (``_cut_short``,
    checked before decoding) or one ffmpeg cannot decode is a ValueError naming the file, what was
    expected (``frames``: how many the caller needs, if it knows) and what came."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"video file {path} is missing")
    expected = f"a video of {height}x{width} frames {declared}" + (
        f" (at least {frames})" if frames is not None else ""
    )
    why = _cut_short(path) if path.suffix.lower() == ".mp4" else None
    if why:
        raise BadInput(
            f"{path}: expected {expected}, got a file cut short ({path.stat().st_size} bytes: {why}); "
            "is it truncated (an interrupted copy or download, a full disk)?"
        )
    cmd = [ffmpeg_exe(), "-loglevel", "error", "-i", str(path), "-map", "0:v:0", "-fps_mode", "passthrough"]
    cmd += ["-f", "image2pipe", "-c:v", "pam", "-pix_fmt", "rgb24", "-"]
    frame_bytes = height * width * 3
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log)
        assert proc.stdout is not None
        try:
            count = 0
            while True:
                shape = _pam_header(proc.stdout, path)
                if shape is None:
                    break
                if shape != (height, width, 3):
                    h, w, depth = shape
                    raise BadInput(
                        f"{path}: frame {count} of the video is {h}x{w} (height x width, {depth} channels), "
                        f"not the {height}x{width} RGB frames {declared}; refused (each frame would be "
                        "read scrambled)"
                    )
                buf = proc.stdout.read(frame_bytes)
                if len(buf) != frame_bytes:
                    raise BadInput(f"{path}: frame {count} is cut short ({len(buf)}/{frame_bytes} bytes)")
                yield np.frombuffer(buf, np.uint8).reshape(height, width, 3)
                count += 1
        finally:
            proc.stdout.close()
            if proc.poll() is None:  # the caller stopped early
                proc.kill()
            code = proc.wait()
        if code not in (0, -9):  # -9: killed above, the caller had what it wanted
            log.seek(0)
            raise BadInput(
                f"{path}: expected {expected}, got a file ffmpeg cannot decode (is it truncated or "
                f"damaged?): {log.read().decode(errors='replace')[-2000:]}"
            )


def read_ranges(
    path: str | Path, height: int, width: int, ranges: list[tuple[int, int]], declared: str = "asked for"
) -> list[np.ndarray]:
    """The frames ``[start, stop)`` of each range, decoding the file once; an error if it is short
    or its frames are not ``height`` x ``width`` (``declared``: where that size comes from)."""

    def empty() -> list[np.ndarray]:
        return [np.empty((max(stop - start, 0), height, width, 3), np.uint8) for start, stop in ranges]

    last = max((stop for _, stop in ranges), default=0)
    out: list[np.ndarray] | None = None  # allocated once the first frame showed the declared size true
    count = 0
    for frame in read_frames(path, height, width, declared, frames=last):
        if count >= last:
            break
        if out is None:
            out = empty()
        for (start, stop), dest in zip(ranges, out):
            if start <= count < stop:
                dest[count - start] = frame
        count += 1
    if count < last:
        raise BadInput(f"{path}: the episodes need {last} frames, the video has {count}")
    return empty() if out is None else out
