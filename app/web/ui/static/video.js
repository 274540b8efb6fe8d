// Video: the mode's fields (frames, fps, where the clip starts from) and a finished clip's
// player. A video model's family (ltx, wan) sets its rules: a clip has k × step + 1 frames
// (8k + 1 for LTX-Video, 4k + 1 for Wan), made at the family's frame rate unless its
// catalog entry says otherwise (app/kinds/video.py, app/families.py).
import { local } from "./api.js";
import { download } from "./save.js";

const $ = (id) => document.getElementById(id);
export const VIDEO_KINDS = ["txt2vid", "img2vid"];
export const VIDEO_FIELDS = ["num_frames", "fps"];
// The family's own, where GET /v1/models does not say (app/families.py).
const FAMILIES = {
  ltx: { name: "LTX-Video", step: 8, fps: 24 },
  wan: { name: "Wan", step: 4, fps: 16 },
};

export function isVideo(kind) {
  return VIDEO_KINDS.includes(kind);
}

// The model's video limits: GET /v1/models gives them in `video` (fps, max_fps,
// default_frames, max_frames, frame_step); the family's rule where it does not.
export function videoLimits(model) {
  const family = FAMILIES[model.family] || { name: model.family, step: 1, fps: null };
  const limits = model.video || {};
  const pick = (...values) => values.find((value) => value !== undefined && value !== null) ?? null;
  return {
    family: family.name,
    familyFps: family.fps,
    step: pick(model.frame_step, limits.frame_step, family.step),
    fps: pick(model.fps, limits.fps, limits.default_fps),
    maxFps: pick(model.max_fps, limits.max_fps),
    defaultFrames: pick(model.default_frames, limits.default_frames),
    maxFrames: pick(model.max_frames, limits.max_frames),
  };
}

// The frames and fps fields follow `model`; with `fillDefaults`, its defaults where it
// gives them (an empty field takes the model's default on the API's side).
export function applyVideoLimits(model, fillDefaults) {
  if (!(model.kinds || []).some(isVideo)) return;
  const limits = videoLimits(model);
  const frames = $("f-num_frames");
  frames.min = limits.step + 1;
  frames.step = limits.step; // from min: step + 1, 2 × step + 1, ...
  const fps = $("f-fps");
  fps.min = 1;
  for (const [box, most] of [[frames, limits.maxFrames], [fps, limits.maxFps]]) {
    if (most === null) box.removeAttribute("max");
    else box.max = most;
  }
  if (fillDefaults) {
    frames.value = limits.defaultFrames ?? "";
    fps.value = "";
  }
  fps.placeholder = limits.fps ? `${limits.fps} (the model's)` : "model default";
  const allowed = counts(limits);
  $("hint-num_frames").textContent =
    `k × ${limits.step} + 1 for ${limits.family}: ${allowed}${allowed.endsWith("…") ? "" : "."}`;
  const rate = limits.fps ?? limits.familyFps;
  $("hint-fps").textContent =
    `How fast it plays: the frames are the same at any rate` +
    (rate ? ` (${limits.family} is made for ${rate} fps)` : "") +
    (limits.maxFps ? `; 1 to ${limits.maxFps}.` : ".");
  clipHint(model);
}

// The frame counts a clip may have: "9, 17, 25" (to the model's most), "9, 17, 25 … 81", or
// "9, 17, 25, …" where the most is not known.
function counts(limits) {
  const all = [1, 2, 3, 4].map((k) => k * limits.step + 1);
  const most = limits.maxFrames;
  if (most === null) return `${all.slice(0, 3).join(", ")}, …`;
  const listed = all.filter((count) => count <= most);
  if (listed.length <= 3) return listed.join(", ");
  return `${listed.slice(0, 3).join(", ")} … ${most}`;
}

// "9 frames at 24 fps: a 0.38 s clip", from the fields (the model's rate when fps is empty
// and the catalog says it).
export function clipHint(model) {
  const frames = Number($("f-num_frames").value);
  const typedFps = $("f-fps").value.trim();
  const fps = typedFps ? Number(typedFps) : model ? videoLimits(model).fps : null;
  const box = $("hint-clip");
  if (!frames || !fps || !Number.isFinite(frames) || !Number.isFinite(fps)) {
    box.textContent = "";
    return;
  }
  box.textContent = `${frames} frames at ${fps} fps: a ${(frames / fps).toFixed(2)} s clip.`;
}

// The video fields shown for the video kinds only; the image count (a clip is one) and
// the strength (a first image is kept as it is) go in video mode.
export function showVideo(kind) {
  const video = isVideo(kind);
  $("video-part").hidden = !video;
  $("num-images-part").hidden = video;
  $("strength-part").hidden = video;
  $("create-heading").textContent = video ? "New video" : "New image";
  document.querySelector("label[for=f-image]").textContent =
    kind === "img2vid" ? "First frame" : "Input image";
}

function caption(job, video) {
  const input = job.input;
  const seconds = video.seconds ?? video.frames / video.fps;
  return (
    `seed ${video.seed ?? input.seed} · ${video.width}×${video.height} · ${video.frames} frames at ` +
    `${video.fps} fps (${seconds.toFixed(2)} s) · ${input.steps} steps · ` +
    `guidance ${input.guidance_scale} · ${job.model}`
  );
}

function size(bytes) {
  if (!bytes) return "";
  return bytes < 1024 * 1024
    ? ` (${Math.max(1, Math.round(bytes / 1024))} KB)`
    : ` (${(bytes / 1024 / 1024).toFixed(1)} MB)`;
}

// A finished clip: an HTML5 player (its poster the first frame), its caption and a link
// that downloads the MP4.
export function clipFigure(job, video, poster, index) {
  const figure = document.createElement("figure");
  figure.className = "clip";
  const player = document.createElement("video");
  player.controls = true;
  player.setAttribute("playsinline", "");
  player.setAttribute("preload", "auto");
  player.width = video.width;
  player.height = video.height;
  if (poster) player.poster = local(poster.url);
  player.setAttribute("aria-label", `Clip ${index + 1} of the job: ${job.input.prompt}`);
  // Said by a browser that plays no <video> (or no H.264): the link below still works.
  player.textContent = "This browser does not play the clip: download the MP4 below.";
  player.src = local(video.url);
  const text = document.createElement("figcaption");
  text.textContent = caption(job, video);
  const save = document.createElement("a");
  save.className = "download";
  save.href = local(video.url);
  save.download = `diffq-${job.id}-${index}.mp4`;
  save.type = video.content_type || "video/mp4";
  save.textContent = `Download the MP4${size(video.bytes)}`;
  save.addEventListener("click", (event) => {
    event.preventDefault();
    download(save.href, save.download);
  });
  figure.append(player, text, save);
  return figure;
}

// The clips of a finished video job, each with its poster (the job's images are its
// posters, in the same order).
export function clipFigures(job) {
  const result = job.result || {};
  const posters = (result.images || []).filter((image) => image.poster !== false);
  return (result.videos || []).map((video, index) => clipFigure(job, video, posters[index], index));
}
