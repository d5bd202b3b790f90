"""The embedded default data set: a fictional multi-hop world generated from a seed.

Why fictional: a small policy must not answer from memory, so every fact has to
be found with the search tool. Why these shapes:
a plain 2-hop world was solved by five minutes of SFT, so this one keeps
headroom for RL:

- name collisions: some entities share a name; their documents get
  Wikipedia-style titles ("Veltrax (electronics company)") and the documents
  that refer to them carry the disambiguating detail ("made by the electronics
  company Veltrax"), so a bare-name search can surface the wrong entity;
- distractor documents with overlapping names and words (product variants,
  venues and prizes named after entities, co-mentions, soundtracks);
- wrong-but-plausible facts inside the right documents (a person "later moved
  to" another city, a film "shot in" one, an actor beside the director);
- question types: 2-hop ``bridge`` and ``comparison`` (train and test); out of
  domain (test only), 3-hop ``compositional`` and 2-hop ``unseen_relation``: one hop
  over a relation no training question follows (a film's star, where it was shot,
  where a person moved, what a founder studied), asked in words no training template
  uses, the way 2Wiki and MuSiQue differ from HotpotQA; and 2-hop ``paraphrase``: a
  trained relation asked in words no training template uses (the shift in wording
  alone, which a trained agent can reach without a new answer type).

Every question's supporting documents are listed in hop order with one gold
search query per hop (``sub_queries``). Documents only point forward (a product
names its maker; a company never lists its products), so the whole question
used as a query cannot find the later hops: the agent has to read and search
again: with BM25 top-3, the question alone finds every supporting document for
few questions, the gold sub-queries for nearly all (tests/test_synthetic.py
asserts <= 0.35 / >= 0.9; `metrics/retrieval.json` has the numbers).

Determinism: everything draws from one local ``random.Random(seed)`` and only
iterates lists and insertion-ordered dicts (never sets), so the same
``(cfg, seed)`` gives byte-identical frames under any ``PYTHONHASHSEED``.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from agent_r1.config import DataConfig, SyntheticConfig
from agent_r1.data.schema import corpus_frame, questions_frame
from agent_r1.data.sources import DataSource

log = logging.getLogger(__name__)

KINDS: tuple[str, ...] = ("country", "city", "person", "company", "product", "film")
ROOT_KINDS: tuple[str, ...] = ("product", "film", "company", "person")  # kinds a question names
COLLIDABLE_KINDS: tuple[str, ...] = ("person", "company", "product", "film", "city")
# Cross-kind collisions (a, b): b takes a's name, e.g. a film named after a city.
CROSS_KIND_PAIRS: tuple[tuple[str, str], ...] = (("city", "film"), ("person", "film"), ("city", "company"))
CROSS_KIND_SHARE = 0.3  # share of collision pairs that span two kinds
BRIDGE_SHARE = 0.6  # share of in-domain questions that are bridge (rest: comparison)
MAX_NEW_NAME_TRIES = 10_000
MIN_DISTRACTORS_PER_NAME = 2  # at the default density more would bury an entity's own document

# ------------------------------------------------------------------ word lists
_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "st", "t",
           "th", "tr", "v", "z", "w", "gr", "sh", "el", "or", "al", "ar")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o")
_MIDDLES = ("l", "n", "r", "v", "d", "s", "m", "t", "nd", "rl", "st", "ll", "rn", "ss")
_FINALS = ("", "", "n", "r", "s", "l", "th", "x", "m")
_COMPANY_ENDS = ("trax", "vane", "lix", "ora", "ion", "ex", "ium", "tek", "ara", "yx", "ova", "ent",
                 "ico", "onix", "ada", "ero", "is", "ant", "ell", "ux")
_COMPANY_SUFFIX = ("Systems", "Labs", "Industries", "Group", "Works", "Dynamics", "Holdings", "Motors",
                   "Foods", "Technologies")
_SURNAME_ENDS = ("man", "son", "ley", "ard", "ell", "ock", "ine", "er", "o", "a", "en", "ski", "ford",
                 "wick", "ton", "is", "ez", "dt", "ova", "ani")
_FIRST_NAMES = ("Mara", "Leo", "Ines", "Tomas", "Anika", "Oskar", "Lena", "Rafael", "Yara", "Emil",
                "Nadia", "Hugo", "Selma", "Ivo", "Talia", "Bruno", "Elin", "Marek", "Sofia", "Arlo",
                "Greta", "Nico", "Odile", "Pavel", "Rhea", "Soren", "Tess", "Viktor", "Wren", "Zora",
                "Amos", "Beatrix", "Cyrus", "Dalia", "Ezra", "Fenna", "Gideon", "Hana", "Ilse", "Jonas",
                "Kira", "Lucian", "Mirela", "Noor", "Orin", "Petra", "Quentin", "Rosa", "Silas", "Thea",
                "Ugo", "Vera", "Wim", "Xenia", "Yusuf", "Zeno", "Alma", "Bodhi", "Clara", "Dorian")
_PRODUCT_LINES = ("Zephyr", "Orbit", "Nova", "Falcon", "Pulse", "Aurora", "Vertex", "Comet", "Echo",
                  "Titan", "Lumen", "Quasar", "Nimbus", "Vortex", "Summit", "Cobalt", "Halo", "Ember",
                  "Stratus", "Kestrel", "Onyx", "Prism", "Rover", "Sable", "Tempest", "Umbra", "Vega",
                  "Willow", "Zenith", "Apex", "Beacon", "Cinder", "Drift", "Flint", "Glacier", "Harbor",
                  "Ion", "Jade", "Krypton", "Lyra", "Mistral", "Nomad", "Oasis", "Pioneer", "Quill",
                  "Raven", "Sierra", "Tundra", "Vela", "Wisp")
_MODEL_LETTERS = ("X", "S", "M", "G", "Q", "R", "Z", "T")
_VARIANT_SUFFIXES = ("Pro", "Lite", "Mini", "Max", "Plus", "Air", "Ultra", "Neo")
_FILM_ADJ = ("Silent", "Crimson", "Hollow", "Broken", "Golden", "Distant", "Frozen", "Burning",
             "Quiet", "Wandering", "Hidden", "Scarlet", "Pale", "Iron", "Velvet", "Bitter", "Endless",
             "Shattered", "Restless", "Lonely", "Savage", "Gentle", "Wild", "Sunken", "Starless")
_FILM_NOUN = ("Harbor", "Lantern", "River", "Garden", "Orchard", "Mirror", "Tide", "Season", "Bridge",
              "Winter", "Meadow", "Station", "Kingdom", "Shore", "Letter", "Echo", "Horizon", "Canyon",
              "Voyage", "Promise", "Island", "Frontier", "Carnival", "Requiem", "Tower", "Signal",
              "Harvest", "Crossing", "Ashes", "Lighthouse")
_CITY_PATTERNS = ("Port {}", "{}ford", "{}ton", "New {}", "{} Falls", "{}burg", "{}haven", "{}mouth",
                  "Saint {}", "{} Bay", "{}dale", "{}")
_COUNTRY_ENDS = ("ia", "ara", "stan", "land", "or", "ene", "avia", "ica", "enia", "ova")

INDUSTRIES: dict[str, tuple[str, ...]] = {
    "electronics": ("smartphone", "laptop", "tablet", "smartwatch", "headphones", "camera"),
    "automotive": ("electric car", "motorcycle", "pickup truck", "electric scooter"),
    "aerospace": ("drone", "satellite", "light aircraft"),
    "beverage": ("energy drink", "soda", "bottled tea"),
    "software": ("video game", "web browser", "office suite", "operating system"),
    "toy": ("board game", "building set", "model train"),
    "sporting goods": ("running shoe", "tennis racket", "bicycle"),
    "home appliance": ("vacuum cleaner", "coffee machine", "washing machine"),
}
GENRES = ("drama", "thriller", "comedy", "horror", "science fiction", "western", "musical",
          "documentary", "animated", "war", "romance", "crime", "fantasy", "mystery")
DIRECTOR_JOBS = ("film director", "screenwriter", "actor", "producer", "playwright")
FOUNDER_JOBS = ("entrepreneur", "engineer", "chemist", "inventor", "investor", "designer", "economist")
OTHER_JOBS = ("architect", "painter", "novelist", "poet", "physicist", "composer", "journalist",
              "historian", "sculptor", "footballer", "botanist", "mathematician", "photographer", "chef",
              "diplomat")
CITY_TYPES = ("port city", "mountain town", "river town", "university town", "market town",
              "coastal city", "industrial city", "desert town", "lake town", "border town")
_FEATURES = ("battery life", "design", "low price", "durability", "build quality", "ease of use")
_SUBJECTS = ("history", "physics", "art", "law", "economics", "music", "chemistry", "philosophy")
_TRAITS = ("old market square", "stone bridges", "annual fair", "botanical garden", "harbour festival",
           "clock tower")
_VENUES = ("Arena", "Tower", "Stadium", "Hall", "Cup", "Pavilion")
_HONOURS = ("Foundation", "Prize", "Award", "Fellowship", "Lecture")


def _a(word: str) -> str:
    """Indefinite article + word ("an electronics", "a drama", "a university")."""
    vowel = word[0].lower() in "aeiou" and not word.lower().startswith(("uni", "use", "eu"))
    return f"{'an' if vowel else 'a'} {word}"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# ------------------------------------------------------------------- entities
@dataclass
class Entity:
    """One world entity. ``facts`` hold scalars (years, categories) or doc_ids of other entities."""

    kind: str
    idx: int
    name: str
    descriptor: str  # disambiguates a shared name: "electronics company", "thriller film", ...
    facts: dict[str, object] = field(default_factory=dict)
    text: str = ""  # its document's text, once written

    @property
    def doc_id(self) -> str:
        return f"{self.kind}-{self.idx:05d}"


@dataclass
class World:
    entities: dict[str, Entity]  # doc_id -> entity, insertion-ordered by kind
    by_kind: dict[str, list[Entity]]
    shared_names: dict[str, int] = field(default_factory=dict)  # name -> entities carrying it (if > 1)

    def get(self, doc_id: object) -> Entity:
        return self.entities[str(doc_id)]

    def is_shared(self, e: Entity) -> bool:
        return self.shared_names.get(e.name, 1) > 1

    def title(self, e: Entity) -> str:
        """Document title: the bare name, or "Name (descriptor)" when the name is shared."""
        return f"{e.name} ({e.descriptor})" if self.is_shared(e) else e.name

    def ref(self, e: Entity) -> str:
        """How other documents and questions refer to ``e``: disambiguated when the name is shared."""
        shared = self.is_shared(e)
        if e.kind == "city":
            return f"the {e.descriptor} of {e.name}" if shared else e.name
        if e.kind == "product":
            return f"the {e.name} {e.descriptor}" if shared else f"the {e.name}"
        return f"the {e.descriptor} {e.name}" if shared else e.name

    def film_ref(self, e: Entity) -> str:
        """A film named inside a longer phrase ("the director of the film X")."""
        return self.ref(e) if self.is_shared(e) else f"the film {e.name}"

    def query(self, e: Entity) -> str:
        """The gold search query for ``e``'s document."""
        return f"{e.name} {e.descriptor}" if self.is_shared(e) else e.name


def _root(rng: random.Random, syllables: int) -> str:
    """A pronounceable made-up stem: "Vel", "Dor" (1 syllable) or "Velan", "Karlos" (2)."""
    if syllables == 1:
        return _cap(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(("l", "n", "r", "s", "m", "v", "")))
    return _cap(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_MIDDLES) + rng.choice(_VOWELS)
                + rng.choice(_FINALS))


def _new_name(rng: random.Random, make: Callable[[random.Random], str], used: set[str], what: str) -> str:
    """A name not used before (case-insensitive), so collisions happen only where we put them."""
    for _ in range(MAX_NEW_NAME_TRIES):
        name = make(rng)
        key = name.lower().removeprefix("the ")  # "The Pale Ashes" and "Pale Ashes" search alike
        if key not in used:
            used.add(key)
            return name
    raise ValueError(f"SyntheticConfig.entities_per_type: ran out of distinct {what} names; lower it")


def _company_name(rng: random.Random) -> str:
    word = _root(rng, 1) + rng.choice(_COMPANY_ENDS)
    return f"{word} {rng.choice(_COMPANY_SUFFIX)}" if rng.random() < 0.3 else word


def _surname(rng: random.Random) -> str:
    return _root(rng, 2) if rng.random() < 0.4 else _root(rng, 1) + rng.choice(_SURNAME_ENDS)


def _person_name(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST_NAMES)} {_surname(rng)}"


def _city_name(rng: random.Random) -> str:
    pattern = rng.choice(_CITY_PATTERNS)
    glued = pattern.startswith("{}") and pattern[2:3].isalpha()  # "{}ford" takes a short stem
    return pattern.format(_root(rng, 1 if glued else 2))


def _country_name(rng: random.Random) -> str:
    return _root(rng, 2).rstrip("aeiou") + rng.choice(_COUNTRY_ENDS)


def _film_name(rng: random.Random) -> str:
    adj, noun = rng.choice(_FILM_ADJ), rng.choice(_FILM_NOUN)
    pattern = rng.randrange(3)
    if pattern == 0:
        return f"The {adj} {noun}"
    if pattern == 1:
        return f"{adj} {noun}"
    return f"{noun} of {_root(rng, 2)}"


def _model_code(rng: random.Random) -> str:
    """Two or more characters, never four digits (a year), never a single character (untokenised)."""
    if rng.random() < 0.6:
        return str(rng.randint(10, 999))
    return f"{rng.choice(_MODEL_LETTERS)}{rng.randint(2, 99)}"


def _build_world(n: int, rng: random.Random) -> World:
    """Entities with unique names and consistent facts (founders born before founding, ...)."""
    used: set[str] = set()
    by_kind: dict[str, list[Entity]] = {k: [] for k in KINDS}

    def add(kind: str, name: str, descriptor: str, **facts: object) -> Entity:
        e = Entity(kind, len(by_kind[kind]), name, descriptor, dict(facts))
        by_kind[kind].append(e)
        return e

    n_countries = max(8, n // 8)
    for _ in range(n_countries):
        add("country", _new_name(rng, _country_name, used, "country"), "country",
            language=_root(rng, 1) + "ic", population=rng.randint(2, 90))
    countries = by_kind["country"]
    for i in range(n):
        country = countries[i % len(countries)] if i < len(countries) else rng.choice(countries)
        add("city", _new_name(rng, _city_name, used, "city"), rng.choice(CITY_TYPES),
            country=country.doc_id, population=rng.randint(8, 950) * 1000, river=_root(rng, 2),
            trait=rng.choice(_TRAITS))
        if "capital" not in country.facts:
            country.facts["capital"] = by_kind["city"][-1].doc_id
    cities = by_kind["city"]
    for _ in range(n):
        add("person", _new_name(rng, _person_name, used, "person"), "", born_in=rng.choice(cities).doc_id,
            birth_year=rng.randint(1900, 1992), subject=rng.choice(_SUBJECTS),
            moved_to=rng.choice(cities).doc_id if rng.random() < 0.5 else None)
    people = by_kind["person"]
    for _ in range(n):
        founder = rng.choice(people)
        born = int(founder.facts["birth_year"])  # type: ignore[arg-type]
        industry = rng.choice(list(INDUSTRIES))
        add("company", _new_name(rng, _company_name, used, "company"), f"{industry} company",
            founded_by=founder.doc_id, founded=rng.randint(born + 22, min(born + 60, 2020)),
            hq=rng.choice(cities).doc_id, industry=industry, staff=rng.randint(2, 900) * 50)
        founder.facts.setdefault("role", "founder")
    companies = by_kind["company"]
    lines = {c.doc_id: rng.sample(_PRODUCT_LINES, 2) for c in companies}
    for _ in range(n):
        maker = rng.choice(companies)
        category = rng.choice(INDUSTRIES[str(maker.facts["industry"])])
        line = rng.choice(lines[maker.doc_id])
        first_year = max(int(maker.facts["founded"]) + 1, 1950)  # type: ignore[call-overload]
        add("product", _new_name(rng, lambda r, line=line: f"{line} {_model_code(r)}", used, "product"),
            category, made_by=maker.doc_id, year=rng.randint(first_year, 2024), feature=rng.choice(_FEATURES))
    for _ in range(n):
        director = rng.choice(people)
        born = int(director.facts["birth_year"])  # type: ignore[arg-type]
        add("film", _new_name(rng, _film_name, used, "film"), f"{rng.choice(GENRES)} film",
            directed_by=director.doc_id, year=rng.randint(born + 22, min(born + 75, 2024)),
            stars=rng.choice(people).doc_id, shot_in=rng.choice(cities).doc_id if rng.random() < 0.5 else None)
        director.facts["role"] = "director"
    for p in people:
        jobs = {"director": DIRECTOR_JOBS, "founder": FOUNDER_JOBS}.get(str(p.facts.get("role")), OTHER_JOBS)
        p.descriptor = rng.choice(jobs)
    entities = {e.doc_id: e for k in KINDS for e in by_kind[k]}
    return World(entities, by_kind)


def _add_collisions(world: World, rate: float, rng: random.Random) -> None:
    """Give ``rate`` of the collidable entities a name shared with exactly one other entity.

    The pair always has different descriptors, so "Name (descriptor)" titles stay unique
    and a descriptor in a query or reference picks exactly one of the two.
    """
    pool = [e for k in COLLIDABLE_KINDS for e in world.by_kind[k]]
    n_pairs = round(rate * len(pool)) // 2
    free: dict[str, list[Entity]] = {k: list(world.by_kind[k]) for k in COLLIDABLE_KINDS}
    for k in free:
        rng.shuffle(free[k])
    made = 0
    for _ in range(n_pairs * 20):
        if made == n_pairs:
            break
        if rng.random() < CROSS_KIND_SHARE:
            ka, kb = rng.choice(CROSS_KIND_PAIRS)
        else:
            ka = kb = rng.choice(COLLIDABLE_KINDS)
        if not free[ka] or len(free[kb]) < (2 if ka == kb else 1):
            continue
        a = free[ka][-1]
        b = next((e for e in reversed(free[kb]) if e is not a and e.descriptor != a.descriptor), None)
        if b is None:
            continue
        free[ka].remove(a)
        free[kb].remove(b)
        b.name = a.name
        made += 1
    if made < n_pairs:  # near rate 1.0 the last few leftovers may have no valid partner
        log.warning("name_collision_rate=%s: made %d of %d name pairs", rate, made, n_pairs)
    if made < 0.98 * n_pairs:
        raise ValueError(f"SyntheticConfig.name_collision_rate={rate}: could only make {made} of {n_pairs} "
                         "name pairs; lower it")
    counts: dict[str, int] = {}
    for e in world.entities.values():
        counts[e.name] = counts.get(e.name, 0) + 1
    world.shared_names = {name: c for name, c in counts.items() if c > 1}


# ------------------------------------------------------------------ documents
def _pick(rng: random.Random, templates: Sequence[str], **fields: object) -> str:
    return rng.choice(templates).format(**fields)


def _entity_text(world: World, e: Entity, rng: random.Random) -> str:
    """2-5 sentences stating the entity's facts in varied templates.

    Documents of kinds that comparisons ask about (company, person, film, product) hold
    exactly one four-digit year, so a reader (or a test) can compare them unambiguously.
    """
    return " ".join(_KIND_TEXTS[e.kind](world, e, rng))


def _product_text(world: World, e: Entity, rng: random.Random) -> list[str]:
    f, ref, name = e.facts, world.ref, e.name
    out: list[str] = []
    maker = ref(world.get(f["made_by"]))
    cat = _a(e.descriptor)
    out.append(_pick(rng, ("The {n} is {c} made by {m}.", "The {n} is {c} produced by {m}.",
                           "{M} makes the {n}, {c}.", "The {n} is {c} from {m}."),
                     n=name, c=cat, m=maker, M=_cap(maker)))
    out.append(_pick(rng, ("It was released in {y}.", "The {n} went on sale in {y}.",
                           "It was first sold in {y}."), n=name, y=f["year"]))
    if rng.random() < 0.6:
        out.append(_pick(rng, ("Reviewers praised its {x}.", "Critics noted its {x}.",
                               "Later versions improved its {x}."), x=f["feature"]))
    return out


def _company_text(world: World, e: Entity, rng: random.Random) -> list[str]:
    f, ref, name = e.facts, world.ref, e.name
    out: list[str] = []
    founder = ref(world.get(f["founded_by"]))
    ind = _a(str(f["industry"]))
    out.append(_pick(rng, ("{n} is {i} company founded in {y} by {p}.",
                           "{n} is {i} company. It was founded by {p} in {y}.",
                           "Founded by {p} in {y}, {n} is {i} company.",
                           "{n} is {i} company that {p} founded in {y}."),
                     n=name, i=ind, y=f["founded"], p=founder))
    out.append(_pick(rng, ("The company is headquartered in {c}.", "Its headquarters are in {c}.",
                           "{n} has its head office in {c}.", "It is based in {c}."),
                     n=name, c=ref(world.get(f["hq"]))))
    if rng.random() < 0.6:
        out.append(f"It employs about {int(f['staff']):,} people.")  # type: ignore[call-overload]
    return out


def _person_text(world: World, e: Entity, rng: random.Random) -> list[str]:
    f, ref, name = e.facts, world.ref, e.name
    out: list[str] = []
    city = ref(world.get(f["born_in"]))
    surname = name.split()[-1]
    job = _a(e.descriptor)
    out.append(_pick(rng, ("{n} is {j} who was born in {c} in {y}.", "{n} (born {y} in {c}) is {j}.",
                           "{n} is {j}. {s} was born in {y} in {c}.", "Born in {c} in {y}, {n} is {j}."),
                     n=name, j=job, c=city, y=f["birth_year"], s=surname))
    if rng.random() < 0.6:
        out.append(f"{surname} studied {f['subject']} at university.")
    if f["moved_to"] is not None and f["moved_to"] != f["born_in"]:
        out.append(f"{surname} later moved to {ref(world.get(f['moved_to']))}.")
    return out


def _film_text(world: World, e: Entity, rng: random.Random) -> list[str]:
    f, ref, name = e.facts, world.ref, e.name
    out: list[str] = []
    director = ref(world.get(f["directed_by"]))
    genre = e.descriptor.removesuffix(" film")
    out.append(_pick(rng, ("{n} is a {y} {g} film directed by {d}.",
                           "{n} is {ga} film directed by {d} and released in {y}.",
                           "Directed by {d}, {n} is {ga} film released in {y}.",
                           "{n} is {ga} film. It was directed by {d} and came out in {y}."),
                     n=name, y=f["year"], g=genre, ga=_a(genre), d=director))
    if f["stars"] != f["directed_by"]:
        out.append(f"It stars {ref(world.get(f['stars']))}.")
    if f["shot_in"] is not None:
        out.append(f"The film was shot in {ref(world.get(f['shot_in']))}.")
    return out


def _city_text(world: World, e: Entity, rng: random.Random) -> list[str]:
    f, name = e.facts, e.name
    out: list[str] = []
    country = world.get(f["country"])
    out.append(_pick(rng, ("{n} is {t} in {c}.", "{n} is {t} located in {c}.",
                           "{n} is {t} in the country of {c}."), n=name, t=_a(e.descriptor), c=country.name))
    if country.facts.get("capital") == e.doc_id:
        out.append(f"It is the capital of {country.name}.")
    out.append(_pick(rng, ("It has a population of about {p}.", "About {p} people live there."),
                     p=f"{int(f['population']):,}"))  # type: ignore[call-overload]
    if rng.random() < 0.5:
        out.append(f"It lies on the {f['river']} River and is known for its {f['trait']}.")
    return out


def _country_text(world: World, e: Entity, rng: random.Random) -> list[str]:
    f, ref, name = e.facts, world.ref, e.name
    out: list[str] = []
    capital = ref(world.get(f["capital"]))
    out.append(_pick(rng, ("{n} is a country whose capital is {c}.", "{n} is a country with its capital at {c}."),
                     n=name, c=capital))
    out.append(f"Its official language is {f['language']}, and about {f['population']} million people live there.")
    return out


_KIND_TEXTS: dict[str, Callable[[World, Entity, random.Random], list[str]]] = {
    "product": _product_text,
    "company": _company_text,
    "person": _person_text,
    "film": _film_text,
    "city": _city_text,
    "country": _country_text,
}


def _distractor(world: World, rng: random.Random) -> tuple[list[Entity], str, str]:
    """One (entities named in the title, title, text): overlapping names and words, not the asked facts."""
    ref, kind = world.ref, rng.randrange(6)
    pick = lambda k: rng.choice(world.by_kind[k])  # noqa: E731
    year = rng.randint(1950, 2024)
    if kind == 0:  # product variant: "Zephyr 90 Pro", maybe from another maker
        p = pick("product")
        maker = world.get(p.facts["made_by"]) if rng.random() < 0.5 else pick("company")
        title = f"{p.name} {rng.choice(_VARIANT_SUFFIXES)}"
        return [p], title, (f"The {title} is {_a(p.descriptor)} made by {ref(maker)}. "
                       f"It was released in {year}, years after the original {p.name}.")
    if kind == 1:  # venue named after a company, in some city
        c, city = pick("company"), pick("city")
        title = f"{c.name} {rng.choice(_VENUES)}"
        return [c], title, (f"The {title} is a venue in {ref(city)}, opened in {year}. "
                       f"It is named after the company {c.name}, its main sponsor.")
    if kind == 2:  # honour named after a person
        p = pick("person")
        title = f"{p.name} {rng.choice(_HONOURS)}"
        return [p], title, (f"The {title} was founded in {year} in honour of {ref(p)}. "
                       f"It is awarded each year in {ref(pick('city'))}.")
    if kind == 3:  # two companies of one industry mentioned together
        a = pick("company")
        same = [c for c in world.by_kind["company"] if c.facts["industry"] == a.facts["industry"] and c is not a]
        b = rng.choice(same) if same else pick("company")
        title = f"{a.name}–{b.name} {rng.choice(('partnership', 'dispute', 'merger talks'))}"
        return [a, b], title, (f"In {year}, {ref(a)} and {ref(b)} made headlines together in the "
                       f"{a.facts['industry']} industry. Talks were held in {ref(pick('city'))}.")
    if kind == 4:  # soundtrack of a film, by someone who is not the director
        film, composer = pick("film"), pick("person")
        return [film], f"{film.name} (soundtrack)", (f"{film.name} is the soundtrack album of "
                                                     f"{world.film_ref(film)}, composed by {ref(composer)} "
                                                     f"and released in {year}.")
    city, p1, p2 = pick("city"), pick("person"), pick("person")  # a forum where people spoke
    title = f"{year} {city.name} {rng.choice(('Design', 'Science', 'Business', 'Film'))} Forum"
    return [city], title, (f"The {title} was held in {ref(city)}. Speakers included {ref(p1)} and {ref(p2)}, "
                   "who talked about their careers.")


def _corpus_records(world: World, distractors_per_entity: float, rng: random.Random) -> list[dict[str, str]]:
    """One document per entity, then the distractors.

    No name gets more than ``cap`` distractors, so the entity's own document stays
    within reach of a search for its name; denser settings raise the cap.
    """
    n_distractors = round(distractors_per_entity * len(world.entities))
    cap = max(MIN_DISTRACTORS_PER_NAME, math.ceil(1.5 * distractors_per_entity))
    for e in world.entities.values():
        e.text = _entity_text(world, e, rng)
    records = [{"doc_id": e.doc_id, "title": world.title(e), "text": e.text} for e in world.entities.values()]
    taken = {r["title"].lower() for r in records} | {e.name.lower() for e in world.entities.values()}
    per_name: dict[str, int] = {}
    made = 0
    for _ in range(n_distractors * 20):
        if made == n_distractors:
            break
        named, title, text = _distractor(world, rng)
        if title.lower() in taken or any(per_name.get(e.name, 0) >= cap for e in named):
            continue
        taken.add(title.lower())
        for e in named:
            per_name[e.name] = per_name.get(e.name, 0) + 1
        records.append({"doc_id": f"note-{made:05d}", "title": title, "text": text})
        made += 1
    if made < n_distractors:
        raise ValueError(f"SyntheticConfig.distractors_per_entity={distractors_per_entity}: could only make "
                         f"{made} of {n_distractors} distinct distractor documents; lower it")
    return records


# ------------------------------------------------------------------ questions
@dataclass(frozen=True)
class Bridge:
    """Follow ``path`` (fact names) from a root entity; the last entity's ``answer`` fact is the answer."""

    name: str
    root_kind: str
    path: tuple[str, ...]
    answer: str
    texts: tuple[str, ...]  # "{r}" = the root's reference


@dataclass(frozen=True)
class Comparison:
    """Pick, of two entities, the one with the smaller (or larger) ``key``; answer its ``answer`` fact."""

    name: str
    kind: str
    key: str
    pick_max: bool
    answer: str
    texts: tuple[str, ...]  # "{a}", "{b}" = the two references


BRIDGES: tuple[Bridge, ...] = (
    Bridge("product_company_founder", "product", ("made_by",), "founded_by",
           ("Who founded the company that makes {r}?", "Who is the founder of the company that produces {r}?")),
    Bridge("product_company_hq", "product", ("made_by",), "hq",
           ("In which city is the company that makes {r} headquartered?",
            "Where is the maker of {r} headquartered?")),
    Bridge("product_company_year", "product", ("made_by",), "founded",
           ("In which year was the company that makes {r} founded?",
            "When was the maker of {r} founded?")),
    Bridge("film_director_city", "film", ("directed_by",), "born_in",
           ("In which city was the director of {f} born?", "Where was the director of {f} born?")),
    Bridge("film_director_year", "film", ("directed_by",), "birth_year",
           ("In which year was the director of {f} born?", "When was the director of {f} born?")),
    Bridge("company_founder_year", "company", ("founded_by",), "birth_year",
           ("In which year was the founder of {r} born?", "When was the person who founded {r} born?")),
    Bridge("company_founder_city", "company", ("founded_by",), "born_in",
           ("In which city was the founder of {r} born?", "Where was the founder of {r} born?")),
    Bridge("company_hq_country", "company", ("hq",), "country",
           ("In which country is {r} headquartered?", "In which country are the headquarters of {r}?")),
    Bridge("person_birth_country", "person", ("born_in",), "country",
           ("In which country was {r} born?", "What is the country of birth of {r}?")),
)
COMPOSITIONALS: tuple[Bridge, ...] = (
    Bridge("product_founder_city", "product", ("made_by", "founded_by"), "born_in",
           ("In which city was the founder of the company that makes {r} born?",)),
    Bridge("product_founder_year", "product", ("made_by", "founded_by"), "birth_year",
           ("In which year was the founder of the company that makes {r} born?",)),
    Bridge("product_hq_country", "product", ("made_by", "hq"), "country",
           ("In which country is the company that makes {r} headquartered?",)),
    Bridge("film_director_country", "film", ("directed_by", "born_in"), "country",
           ("In which country was the director of {f} born?",)),
    Bridge("company_founder_country", "company", ("founded_by", "born_in"), "country",
           ("In which country was the founder of {r} born?",)),
)
# Out of domain, 2-hop: each follows one relation (stars, shot_in, moved_to, subject) that no
# BRIDGES/COMPARISONS template asks about, phrased unlike any of them; the agent's two
# searches are the same moves as in training, so a trained agent can reach them.
UNSEEN_RELATIONS: tuple[Bridge, ...] = (
    Bridge("film_star_city", "film", ("stars",), "born_in",
           ("Which city does the actor starring in {f} come from?", "What is the hometown of the star of {f}?")),
    Bridge("film_star_year", "film", ("stars",), "birth_year",
           ("The actor who stars in {f} came into the world in what year?",)),
    Bridge("film_location_country", "film", ("shot_in",), "country",
           ("{f} was filmed in a city of which country?", "Which nation was {f} shot in?")),
    Bridge("person_moved_country", "person", ("moved_to",), "country",
           ("To which country did {r} later relocate?", "{r} eventually moved to a city in which nation?")),
    Bridge("company_founder_subject", "company", ("founded_by",), "subject",
           ("What did the person who set up {r} study at university?",)),
)
# Out of domain, 2-hop: one paraphrase of each BRIDGES relation, sharing no 4 words in a row
# with any training template: the question's wording changes, the answer's type does not.
PARAPHRASES: tuple[Bridge, ...] = (
    Bridge("product_company_founder", "product", ("made_by",), "founded_by",
           ("Name the person who set up the firm that manufactures {r}.",)),
    Bridge("product_company_hq", "product", ("made_by",), "hq",
           ("{r} comes from a firm based in which city?",)),
    Bridge("product_company_year", "product", ("made_by",), "founded",
           ("The firm that manufactures {r} dates from which year?",)),
    Bridge("film_director_city", "film", ("directed_by",), "born_in",
           ("The filmmaker behind {f} was born in what city?",)),
    Bridge("film_director_year", "film", ("directed_by",), "birth_year",
           ("The filmmaker behind {f} was born in what year?",)),
    Bridge("company_founder_year", "company", ("founded_by",), "birth_year",
           ("{r} was started by someone born in what year?",)),
    Bridge("company_founder_city", "company", ("founded_by",), "born_in",
           ("Whoever started {r} was born in what city?",)),
    Bridge("company_hq_country", "company", ("hq",), "country",
           ("{r} keeps its head office in what nation?",)),
    Bridge("person_birth_country", "person", ("born_in",), "country",
           ("Which nation is home to the birthplace of {r}?",)),
)
COMPARISONS: tuple[Comparison, ...] = (
    Comparison("older_company_founder", "company", "founded", False, "founded_by",
               ("Who founded the older company, {a} or {b}?",
                "Who is the founder of whichever company was founded first, {a} or {b}?")),
    Comparison("younger_company_founder", "company", "founded", True, "founded_by",
               ("Who founded the younger company, {a} or {b}?",)),
    Comparison("older_company_hq", "company", "founded", False, "hq",
               ("In which city is the company that was founded first, {a} or {b}, headquartered?",)),
    Comparison("younger_company_hq", "company", "founded", True, "hq",
               ("Where is the newer company, {a} or {b}, headquartered?",)),
    Comparison("older_person_city", "person", "birth_year", False, "born_in",
               ("In which city was the older person, {a} or {b}, born?",
                "Which city was the older of {a} and {b} born in?")),
    Comparison("younger_person_city", "person", "birth_year", True, "born_in",
               ("In which city was the younger of {a} and {b} born?",)),
    Comparison("newer_film_director", "film", "year", True, "directed_by",
               ("Who directed the more recent film, {a} or {b}?",)),
    Comparison("older_film_director", "film", "year", False, "directed_by",
               ("Who directed the earlier film, {a} or {b}?",)),
    Comparison("newer_product_maker", "product", "year", True, "made_by",
               ("Which company makes the newer product, {a} or {b}?",)),
    Comparison("older_product_maker", "product", "year", False, "made_by",
               ("Which company makes the older product, {a} or {b}?",)),
)


def _answer_value(world: World, e: Entity, fact: str) -> str:
    value = e.facts[fact]
    return world.get(value).name if isinstance(value, str) and value in world.entities else str(value)


def _mentions(text: str, answer: str) -> bool:
    """Case-insensitive whole-word occurrence (the answer must never be in the question)."""
    return re.search(rf"(?<!\w){re.escape(answer.lower())}(?!\w)", text.lower()) is not None


def _record(question: str, answer: str, chain: Sequence[Entity], world: World, qtype: str,
            source: str) -> dict[str, object] | None:
    if _mentions(question, answer):
        return None
    return {"question": question, "answers": [answer], "supporting_titles": [world.title(e) for e in chain],
            "type": qtype, "source": source, "sub_queries": [world.query(e) for e in chain]}


def _relation_written(e: Entity, fact: str) -> bool:
    """Whether ``e``'s document states ``fact`` as that relation: optional relations may be
    absent (shot_in, moved_to), and a star who directed the film or a move back to the
    birthplace is not written as such (_film_text, _person_text)."""
    value = e.facts.get(fact)
    if value is None:
        return False
    return not ((fact == "stars" and value == e.facts["directed_by"])
                or (fact == "moved_to" and value == e.facts["born_in"]))


def _stated(world: World, chain: Sequence[Entity], answer: str) -> bool:
    """Each hop's entity named in the document before it, the answer in the last one: some
    facts (a film's star who is also its director, a person's studies) are not always written."""
    hops_named = all(_mentions(a.text, b.name) for a, b in zip(chain, chain[1:]))
    return hops_named and _mentions(chain[-1].text, answer)


def _bridge_record(world: World, t: Bridge, root: Entity, rng: random.Random, qtype: str,
                   source: str) -> dict[str, object] | None:
    chain = [root]
    for fact in t.path:
        if not _relation_written(chain[-1], fact):
            return None
        chain.append(world.get(chain[-1].facts[fact]))
    if any(_mentions(e.text, root.name) for e in chain[1:]):  # rare name clash: a later hop would be findable
        return None
    answer = _answer_value(world, chain[-1], t.answer)
    if not _stated(world, chain, answer):
        return None
    question = rng.choice(t.texts).format(r=world.ref(root), f=world.film_ref(root))
    return _record(_cap(question), answer, chain, world, qtype, source)


def _comparison_record(world: World, t: Comparison, a: Entity, b: Entity,
                       rng: random.Random) -> dict[str, object] | None:
    ka, kb = a.facts[t.key], b.facts[t.key]
    va, vb = _answer_value(world, a, t.answer), _answer_value(world, b, t.answer)
    if ka == kb or va == vb:  # a tie, or both options give the same answer
        return None
    winner = a if (int(ka) > int(kb)) == t.pick_max else b  # type: ignore[call-overload]
    question = _cap(rng.choice(t.texts).format(a=world.ref(a), b=world.ref(b)))
    return _record(question, va if winner is a else vb, [a, b], world, "comparison", "synthetic")


def _split_roots(world: World, test_fraction: float, rng: random.Random) -> dict[str, dict[str, list[Entity]]]:
    """Per split, per root kind, the entities a question may name (disjoint between splits)."""
    out: dict[str, dict[str, list[Entity]]] = {"train": {}, "test": {}}
    for kind in ROOT_KINDS:
        members = list(world.by_kind[kind])
        rng.shuffle(members)
        n_test = round(test_fraction * len(members))
        out["test"][kind], out["train"][kind] = members[:n_test], members[n_test:]
    return out


def _infeasible(field_name: str, value: int, need: int, have: int, what: str) -> ValueError:
    fraction = "lower" if field_name == "n_train" else "raise"
    return ValueError(
        f"SyntheticConfig.{field_name}={value} needs {need} {what} questions but only {have} distinct ones "
        f"can be made from the root entities of that split; lower {field_name}, raise entities_per_type "
        f"or {fraction} test_entity_fraction")


def _draw_bridges(world: World, templates: Sequence[Bridge], roots: dict[str, list[Entity]], n: int,
                  rng: random.Random, qtype: str, source: str, field_name: str,
                  n_total: int) -> list[dict[str, object]]:
    """``n`` distinct questions, round-robin over templates so every template is represented."""
    queues = []
    for t in templates:
        q = list(roots[t.root_kind])
        rng.shuffle(q)
        queues.append(q)
    capacity = sum(len(q) for q in queues)
    if n > capacity:
        raise _infeasible(field_name, n_total, n, capacity, qtype)
    out: list[dict[str, object]] = []
    while len(out) < n and any(queues):
        for t, queue in zip(templates, queues):
            while queue and len(out) < n:
                rec = _bridge_record(world, t, queue.pop(), rng, qtype, source)
                if rec is not None:
                    out.append(rec)
                    break
    if len(out) < n:
        raise _infeasible(field_name, n_total, n, len(out), qtype)
    return out


def _draw_comparisons(world: World, roots: dict[str, list[Entity]], n: int, rng: random.Random,
                      field_name: str, n_total: int) -> list[dict[str, object]]:
    """``n`` distinct comparison questions from random same-split pairs, templates in turn."""
    out: list[dict[str, object]] = []
    seen: set[tuple[str, str, str]] = set()
    usable = [t for t in COMPARISONS if len(roots[t.kind]) >= 2]
    capacity = sum(len(roots[t.kind]) * (len(roots[t.kind]) - 1) // 2 for t in usable)
    if n > capacity:
        raise _infeasible(field_name, n_total, n, capacity, "comparison")
    for attempt in range(50 * n + 1000 if n else 0):
        if len(out) == n:
            break
        t = usable[attempt % len(usable)]
        a, b = rng.sample(roots[t.kind], 2)
        key = (t.name, *sorted((a.doc_id, b.doc_id)))
        if key in seen:
            continue
        rec = _comparison_record(world, t, a, b, rng)
        if rec is not None:
            seen.add(key)
            out.append(rec)
    if len(out) < n:
        raise _infeasible(field_name, n_total, n, len(out), "comparison")
    return out


def _in_domain(world: World, roots: dict[str, list[Entity]], n: int, rng: random.Random,
               field_name: str) -> list[dict[str, object]]:
    n_bridge = round(BRIDGE_SHARE * n)
    records = (_draw_bridges(world, BRIDGES, roots, n_bridge, rng, "bridge", "synthetic", field_name, n)
               + _draw_comparisons(world, roots, n - n_bridge, rng, field_name, n))
    rng.shuffle(records)
    return records


# ------------------------------------------------------------------------ API
def generate(cfg: SyntheticConfig, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The (questions, corpus) frames of the world for ``(cfg, seed)``; deterministic.

    Questions hold both splits: ``train`` (bridge + comparison, ``cfg.n_train``) and
    ``test`` (``cfg.n_test`` in-domain, then ``cfg.n_test_ood`` 3-hop compositional, then
    ``cfg.n_test_ood_2hop`` 2-hop over unseen relations, then ``cfg.n_test_paraphrase``
    2-hop paraphrases: each set drawn after the ones before, so adding it left every
    earlier question as it was). Train and test name disjoint root entities; the
    corpus is shared by both.
    """
    rng = random.Random(seed)
    world = _build_world(cfg.entities_per_type, rng)
    _add_collisions(world, cfg.name_collision_rate, rng)
    corpus = _corpus_records(world, cfg.distractors_per_entity, rng)
    roots = _split_roots(world, cfg.test_entity_fraction, rng)

    train = _in_domain(world, roots["train"], cfg.n_train, rng, "n_train")
    test = _in_domain(world, roots["test"], cfg.n_test, rng, "n_test")
    ood = _draw_bridges(world, COMPOSITIONALS, roots["test"], cfg.n_test_ood, rng, "compositional",
                        "synthetic_3hop", "n_test_ood", cfg.n_test_ood) if cfg.n_test_ood else []
    ood_2hop = _draw_bridges(world, UNSEEN_RELATIONS, roots["test"], cfg.n_test_ood_2hop, rng, "unseen_relation",
                             "synthetic_2hop_ood", "n_test_ood_2hop", cfg.n_test_ood_2hop) if cfg.n_test_ood_2hop else []
    paraphrase = _draw_bridges(world, PARAPHRASES, roots["test"], cfg.n_test_paraphrase, rng, "paraphrase",
                               "synthetic_2hop_paraphrase", "n_test_paraphrase",
                               cfg.n_test_paraphrase) if cfg.n_test_paraphrase else []
    ood_all = ood + ood_2hop + paraphrase
    records = []
    for split, recs in (("train", train), ("test", test + ood_all)):
        for i, rec in enumerate(recs):
            records.append({"id": f"syn-{split}-{i:06d}", **rec, "split": split})
    log.info("synthetic world: %d entities (%d share a name), %d documents, %d train / %d test questions",
             len(world.entities), sum(world.shared_names.values()), len(corpus), len(train), len(test) + len(ood_all))
    return questions_frame(records, f"synthetic(seed={seed})"), corpus_frame(corpus, f"synthetic(seed={seed})")


class SyntheticWorld(DataSource):
    """``data.source: synthetic``: the generated world of this module (sizes: ``data.synthetic``)."""

    def generate(self, data: DataConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
        return generate(data.synthetic, data.seed)
