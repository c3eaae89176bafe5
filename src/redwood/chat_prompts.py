"""General-chat prompts: the `chat` prompt set of `redwood bench --prompt-set chat`.

The edit sets (redwood.edit_tasks) measure input-grounded requests, where much of the answer
copies the prompt; these measure the opposite case, free-form answers with little to copy:
creative writing, explanation, reasoning, arithmetic, advice and summarising a paragraph
given in the prompt. Written for redwood (no download), fixed text and order, so prompt i is
the same on every run; each is one user message, encoded with the chat template.

The last CALIBRATION_COUNT prompts are also the n-gram drafter's chat calibration split
(`redwood calibrate --drafter ngram --prompts chat`, measure/calibrate.py): a bench of at most
CALIBRATION_FROM chat prompts never runs a prompt its priors came from.
"""
from __future__ import annotations

from redwood.errors import RedwoodError

_PARAGRAPH_TIDES = (
    "Tides are caused mainly by the Moon's gravity. The side of the Earth facing the Moon is "
    "pulled slightly more strongly than the Earth's centre, and the far side slightly less, "
    "so the oceans bulge on both sides. As the Earth turns, a coastline passes through both "
    "bulges, which is why most places see two high tides a day. The Sun adds a smaller "
    "effect: when Sun and Moon line up, at new and full moon, the tides are strongest.")
_PARAGRAPH_BRIDGE = (
    "The town council voted on Tuesday to close the old river bridge to cars from the first "
    "of March. Engineers found corrosion in two of the steel supports last autumn and "
    "estimate that repairs will take eight months. Pedestrians and cyclists may still use a "
    "narrow lane on the east side. Buses will be diverted over the motorway bridge, adding "
    "about ten minutes to routes 4 and 7, and the council will review the plan in June.")
_PARAGRAPH_SLEEP = (
    "In a study of 2,000 adults, people who slept fewer than six hours a night reported "
    "catching colds about twice as often as those who slept seven to eight hours. The "
    "researchers caution that the study only shows an association: people who sleep less "
    "may also have more stress or more contact with sick children. A smaller follow-up, in "
    "which volunteers were exposed to a cold virus in a lab, found a similar pattern.")

# (category, user message). Order is part of the set's definition: never reorder.
CHAT_PROMPTS: tuple[tuple[str, str], ...] = (
    ("creative", "Write a short poem, eight lines, about a lighthouse keeper on his last night "
                 "before the light is automated."),
    ("explain", "Explain how a refrigerator keeps food cold, in simple terms a twelve-year-old "
                "would follow."),
    ("reasoning", "A farmer has to take a wolf, a goat and a cabbage across a river in a boat "
                  "that holds him and one item. The wolf eats the goat and the goat eats the "
                  "cabbage if left alone together. How does he get everything across? Explain "
                  "each trip."),
    ("math", "A train leaves at 9:40 and arrives at 13:05. It stopped for 12 minutes on the way. "
             "How long was it actually moving? Show your working."),
    ("advice", "I have a job interview for a junior accountant position next week. What should "
               "I prepare, and what questions could I ask the interviewer?"),
    ("summarise", f"Summarise this paragraph in two sentences:\n\n{_PARAGRAPH_TIDES}"),
    ("creative", "Write the opening paragraph of a mystery story set in a small bakery, where "
                 "the baker discovers that the morning's bread has already been baked."),
    ("explain", "What is the difference between weather and climate? Give an example of each."),
    ("reasoning", "If all bloops are razzies and some razzies are lazzies, can we conclude that "
                  "some bloops are lazzies? Explain why or why not."),
    ("math", "What is 15% of 240, and what is 240 increased by 15%? Explain the difference "
             "between the two answers."),
    ("advice", "How can I keep a basil plant alive on a kitchen windowsill? It keeps wilting."),
    ("summarise", f"Summarise the following news item for a busy commuter, in three bullet "
                  f"points:\n\n{_PARAGRAPH_BRIDGE}"),
    ("creative", "Write a friendly letter from a cat to the family dog, complaining about the "
                 "new sofa arrangements."),
    ("explain", "Why is the sky blue during the day but red and orange at sunset?"),
    ("reasoning", "Three friends split a restaurant bill. Anna paid twice as much as Ben, and "
                  "Ben paid 10 euros more than Clara. The bill was 130 euros. How much did each "
                  "pay?"),
    ("math", "Is 221 a prime number? Explain how you checked."),
    ("advice", "What are some good ways to start learning a new language as a busy adult with "
               "only twenty minutes a day?"),
    ("summarise", f"Summarise this paragraph in one sentence, then say what it does not "
                  f"prove:\n\n{_PARAGRAPH_SLEEP}"),
    ("creative", "Describe a busy market in a city on another planet, using all five senses."),
    ("explain", "Explain what inflation is and why central banks raise interest rates to fight it."),
    ("reasoning", "A clock shows 3:15. What is the angle between the hour hand and the minute "
                  "hand? Explain step by step."),
    ("math", "A rectangle has a perimeter of 36 cm and its length is twice its width. What is "
             "its area?"),
    ("advice", "My friend and I argued about a small thing and now we are not speaking. How "
               "could I start a conversation to make up?"),
    ("summarise", f"Explain the main idea of this paragraph to a child, in three short "
                  f"sentences:\n\n{_PARAGRAPH_TIDES}"),
)


CALIBRATION_COUNT = 12
CALIBRATION_FROM = len(CHAT_PROMPTS) - CALIBRATION_COUNT   # chat-12: the split's first prompt


def chat_calibration_prompts() -> list[str]:
    """The user messages of the calibration split: the last CALIBRATION_COUNT prompts."""
    return [text for _, text in CHAT_PROMPTS[CALIBRATION_FROM:]]


def chat_prompts(count: int | None = None) -> list[tuple[str, str, str]]:
    """The first `count` chat prompts (all when None) as (name, category, user message);
    names are "chat-0", "chat-1", ..."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise RedwoodError(f"number of chat prompts must be an integer >= 1, got {count!r}")
    chosen = CHAT_PROMPTS[:count] if count else CHAT_PROMPTS
    return [(f"chat-{i}", category, text) for i, (category, text) in enumerate(chosen)]
