"""Synthetic companies for the finance-sql environment: their statements as one SQLite file each, and questions
whose gold numbers are computed from the same rows.

    company = make_company(seed=0, split="train", index=0)      # "Fairhaven Energy Inc.", fiscal 2019-2024
    write_database(company, "/tmp/fairhaven.sqlite")             # company, income_statement, balance_sheet, ...
    questions = make_questions(company, "train")                 # [Question(kind="value", gold=..., ...), ...]

Everything is a pure function of (seed, split, index): the same triple gives the same company, byte-identical
rows and the same questions, so a database can be rebuilt anywhere a task is replayed. Money is in USD millions
rounded to 0.1, and every identity holds exactly on the stored numbers (gross_profit = revenue - cost_of_revenue,
shareholders_equity = total_assets - total_liabilities, free_cash_flow = operating_cash_flow -
capital_expenditure, segments sum to revenue), so a gold answer is what a correct SQL query returns.

Each split draws its companies from its own third of the name pool, so no (company, question) pair is shared
between train, eval-single and eval-multi. Train and eval-single ask single-table questions; eval-multi asks
questions that need two tables.
"""

from __future__ import annotations

import itertools
import random
import sqlite3
from dataclasses import dataclass, field

YEARS = tuple(range(2019, 2025))
SPLITS = ("train", "eval-single", "eval-multi")
GENERATOR_VERSION = 1  # part of the database file name: bump when the rows a seed produces change

# table -> (description, [(column, SQL type, description)]); the source of both CREATE TABLE and describe_table
SCHEMA: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    "company": ("who the company is and how its statements are reported", [
        ("company_name", "TEXT", "legal name"),
        ("ticker", "TEXT", "stock ticker"),
        ("sector", "TEXT", "industry sector"),
        ("currency", "TEXT", "reporting currency (USD)"),
        ("units", "TEXT", "unit of every money column in every table (USD millions)"),
        ("fiscal_year_end", "TEXT", "last day of each fiscal year"),
    ]),
    "income_statement": ("annual income statement, one row per fiscal_year; money in USD millions", [
        ("fiscal_year", "INTEGER", "fiscal year"),
        ("revenue", "REAL", "total revenue, USD millions"),
        ("cost_of_revenue", "REAL", "cost of revenue, USD millions"),
        ("gross_profit", "REAL", "revenue - cost_of_revenue, USD millions"),
        ("research_and_development", "REAL", "research and development expense, USD millions"),
        ("selling_general_admin", "REAL", "selling, general and administrative expense, USD millions"),
        ("operating_expenses", "REAL", "research_and_development + selling_general_admin, USD millions"),
        ("operating_income", "REAL", "gross_profit - operating_expenses, USD millions"),
        ("interest_expense", "REAL", "interest expense, USD millions"),
        ("pretax_income", "REAL", "operating_income - interest_expense, USD millions"),
        ("income_tax", "REAL", "income tax expense, USD millions"),
        ("net_income", "REAL", "pretax_income - income_tax, USD millions"),
    ]),
    "balance_sheet": ("balance sheet at each fiscal year end, one row per fiscal_year; money in USD millions", [
        ("fiscal_year", "INTEGER", "fiscal year (balances at its end)"),
        ("cash_and_equivalents", "REAL", "cash and cash equivalents, USD millions"),
        ("accounts_receivable", "REAL", "accounts receivable, USD millions"),
        ("inventory", "REAL", "inventories, USD millions"),
        ("total_current_assets", "REAL", "total current assets, USD millions"),
        ("total_assets", "REAL", "total assets, USD millions"),
        ("accounts_payable", "REAL", "accounts payable, USD millions"),
        ("total_current_liabilities", "REAL", "total current liabilities, USD millions"),
        ("long_term_debt", "REAL", "long-term debt, USD millions"),
        ("total_liabilities", "REAL", "total liabilities, USD millions"),
        ("shareholders_equity", "REAL", "total_assets - total_liabilities, USD millions"),
    ]),
    "cash_flow": ("annual cash flow statement, one row per fiscal_year; money in USD millions "
                  "(outflows such as capital_expenditure are stored as positive amounts)", [
        ("fiscal_year", "INTEGER", "fiscal year"),
        ("net_income", "REAL", "net income (as in income_statement), USD millions"),
        ("depreciation_amortization", "REAL", "depreciation and amortization, USD millions"),
        ("change_in_working_capital", "REAL", "cash from working capital changes, USD millions"),
        ("operating_cash_flow", "REAL",
         "net_income + depreciation_amortization + change_in_working_capital, USD millions"),
        ("capital_expenditure", "REAL", "purchases of property and equipment (a positive outflow), USD millions"),
        ("free_cash_flow", "REAL", "operating_cash_flow - capital_expenditure, USD millions"),
        ("dividends_paid", "REAL", "dividends paid (a positive outflow), USD millions"),
        ("share_repurchases", "REAL", "share buybacks (a positive outflow), USD millions"),
    ]),
    "segment_revenue": ("revenue by business segment, one row per (fiscal_year, segment); segments sum to "
                        "income_statement.revenue; money in USD millions", [
        ("fiscal_year", "INTEGER", "fiscal year"),
        ("segment", "TEXT", "business segment name"),
        ("revenue", "REAL", "segment revenue, USD millions"),
    ]),
}

# sector -> (name word, gross margin, R&D share of revenue, capex share of revenue, segments)
SECTORS = {
    "Marine": ("Marine", 0.32, 0.01, 0.09, ("Offshore Services", "Shipbuilding", "Port Logistics")),
    "Software": ("Software", 0.72, 0.18, 0.03, ("Cloud Subscriptions", "Licenses", "Professional Services")),
    "Biosciences": ("Biosciences", 0.64, 0.21, 0.05, ("Therapeutics", "Diagnostics", "Research Tools")),
    "Foods": ("Foods", 0.29, 0.01, 0.04, ("Packaged Foods", "Beverages", "Food Service", "International")),
    "Energy": ("Energy", 0.38, 0.02, 0.14, ("Upstream", "Midstream", "Renewables")),
    "Industrials": ("Industrial", 0.31, 0.03, 0.05, ("Automation", "Power Systems", "Aftermarket Parts")),
    "Retail": ("Retail", 0.27, 0.0, 0.03, ("Stores", "E-commerce", "Wholesale")),
    "Logistics": ("Logistics", 0.22, 0.01, 0.07, ("Freight Forwarding", "Warehousing", "Last Mile")),
}
SURNAMES = ("Halvorsen", "Castellan", "Brightwater", "Okafor", "Lindqvist", "Marrow", "Pennington", "Achterberg",
            "Sato", "Vireo", "Delacroix", "Ashdown", "Kessler", "Moravec", "Northgate", "Oyelaran", "Quintero",
            "Rasmussen", "Silvermere", "Tanaka", "Underhill", "Valdivia", "Whitcombe", "Yarrow", "Zelenko",
            "Bramwell", "Corriveau", "Eskildsen", "Fairhaven", "Grünwald")
SUFFIXES = ("Holdings", "Group", "Inc.", "Corporation", "plc", "Industries", "Partners", "Co.")
MAX_COMPANIES = len(SURNAMES) * len(SECTORS) // len(SPLITS)  # per split


@dataclass(frozen=True)
class Company:
    seed: int
    split: str
    index: int
    name: str
    ticker: str
    sector: str
    segments: tuple[str, ...]
    tables: dict = field(hash=False)  # table -> list of row dicts in SCHEMA column order

    def value(self, table: str, column: str, year: int, segment: str | None = None) -> float:
        for row in self.tables[table]:
            if row["fiscal_year"] == year and (segment is None or row["segment"] == segment):
                return row[column]
        raise KeyError(f"{table}.{column} has no row for fiscal {year} segment {segment!r}")


def _name_pool(seed: int) -> list[tuple[str, str]]:
    pool = list(itertools.product(SURNAMES, SECTORS))
    random.Random(f"finance-names:{seed}").shuffle(pool)
    return pool


def make_company(seed: int, split: str, index: int) -> Company:
    """The `index`-th company of `split` for `seed` (split k takes every third name from position k)."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
    if not 0 <= index < MAX_COMPANIES:
        raise ValueError(f"company index {index} is out of range 0..{MAX_COMPANIES - 1}")
    surname, sector = _name_pool(seed)[len(SPLITS) * index + SPLITS.index(split)]
    rng = random.Random(f"finance-company:{seed}:{split}:{index}")
    word, gross_margin, rd_share, capex_share, segments = SECTORS[sector]
    name = f"{surname} {word} {rng.choice([s for s in SUFFIXES if not s.startswith(word[:5])])}"
    ticker = (surname[:3] + word[0]).upper().replace("Ü", "U")
    return Company(seed, split, index, name, ticker, sector, segments,
                   _statements(rng, gross_margin, rd_share, capex_share, segments))


def _statements(rng: random.Random, gross_margin: float, rd_share: float, capex_share: float,
                segments: tuple[str, ...]) -> dict:
    r1 = lambda x: round(x, 1)  # noqa: E731 - every stored amount is rounded to USD 0.1 million
    revenue = r1(10 ** rng.uniform(2.4, 4.6))  # USD 250 million .. 40 billion
    sga_share = max(0.05, gross_margin - rd_share - rng.uniform(0.04, 0.22))  # leaves a 4-22% operating margin
    assets_per_revenue = rng.uniform(0.7, 1.9)
    liabilities_share = rng.uniform(0.35, 0.7)
    debt_share = rng.uniform(0.2, 0.55)  # of total liabilities
    tax_rate = rng.uniform(0.17, 0.27)
    payout = rng.choice((0.0, 0.2, 0.3, 0.4))
    shares = [rng.uniform(0.5, 1.5) for _ in segments]
    income, balance, cash, segment_rows = [], [], [], []
    for year in YEARS:
        if year != YEARS[0]:
            revenue = r1(revenue * (1 + rng.gauss(0.06, 0.09)))
        cost = r1(revenue * (1 - gross_margin - rng.uniform(-0.04, 0.04)))
        gross = r1(revenue - cost)
        rd = r1(revenue * rd_share * rng.uniform(0.85, 1.15))
        sga = r1(revenue * sga_share * rng.uniform(0.85, 1.15))
        opex = r1(rd + sga)
        operating = r1(gross - opex)
        assets = r1(revenue * assets_per_revenue * rng.uniform(0.92, 1.08))
        liabilities = r1(assets * liabilities_share * rng.uniform(0.95, 1.05))
        debt = r1(liabilities * debt_share * rng.uniform(0.85, 1.15))
        interest = r1(debt * rng.uniform(0.03, 0.065))
        pretax = r1(operating - interest)
        tax = r1(pretax * tax_rate)
        net = r1(pretax - tax)
        income.append(dict(fiscal_year=year, revenue=revenue, cost_of_revenue=cost, gross_profit=gross,
                           research_and_development=rd, selling_general_admin=sga, operating_expenses=opex,
                           operating_income=operating, interest_expense=interest, pretax_income=pretax,
                           income_tax=tax, net_income=net))

        cash_eq = r1(assets * rng.uniform(0.05, 0.18))
        receivable = r1(revenue * rng.uniform(30, 70) / 365)
        inventory = r1(cost * rng.uniform(0, 90) / 365) if rd_share < 0.15 else r1(cost * rng.uniform(0, 20) / 365)
        current_assets = r1(cash_eq + receivable + inventory + assets * rng.uniform(0.02, 0.05))
        current_liabilities = r1((liabilities - debt) * rng.uniform(0.45, 0.8))
        payable = r1(current_liabilities * rng.uniform(0.3, 0.6))
        balance.append(dict(fiscal_year=year, cash_and_equivalents=cash_eq, accounts_receivable=receivable,
                            inventory=inventory, total_current_assets=current_assets, total_assets=assets,
                            accounts_payable=payable, total_current_liabilities=current_liabilities,
                            long_term_debt=debt, total_liabilities=liabilities,
                            shareholders_equity=r1(assets - liabilities)))

        depreciation = r1(assets * rng.uniform(0.025, 0.05))
        working_capital = r1(revenue * rng.uniform(-0.03, 0.02))
        ocf = r1(net + depreciation + working_capital)
        capex = r1(revenue * capex_share * rng.uniform(0.75, 1.25))
        cash.append(dict(fiscal_year=year, net_income=net, depreciation_amortization=depreciation,
                         change_in_working_capital=working_capital, operating_cash_flow=ocf,
                         capital_expenditure=capex, free_cash_flow=r1(ocf - capex),
                         dividends_paid=r1(max(net, 0.0) * payout), share_repurchases=r1(
                             max(net, 0.0) * rng.choice((0.0, 0.1, 0.25)))))

        # segment shares drift a little each year; the last segment takes the rounding remainder
        shares = [s * rng.uniform(0.9, 1.12) for s in shares]
        parts = [r1(revenue * s / sum(shares)) for s in shares[:-1]]
        parts.append(r1(revenue - sum(parts)))
        segment_rows += [dict(fiscal_year=year, segment=seg, revenue=part)
                         for seg, part in zip(segments, parts, strict=True)]
    return {"income_statement": income, "balance_sheet": balance, "cash_flow": cash,
            "segment_revenue": segment_rows}


def write_database(company: Company, path: str) -> None:
    """Write `company` as a fresh SQLite file at `path` (the caller makes it atomic and read-only)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        # no journal and no fsync: the file is written once, to a temporary name the caller renames into place
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("BEGIN")
        for table, (_, columns) in SCHEMA.items():
            conn.execute(f"CREATE TABLE {table} ({', '.join(f'{c} {t} NOT NULL' for c, t, _ in columns)})")
        conn.execute("INSERT INTO company VALUES (?, ?, ?, 'USD', 'USD millions', 'December 31')",
                     (company.name, company.ticker, company.sector))
        for table, rows in company.tables.items():
            names = [c for c, _, _ in SCHEMA[table][1]]
            conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(names))})",
                             [tuple(row[n] for n in names) for row in rows])
        conn.execute("COMMIT")
    finally:
        conn.close()


# --- questions -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    """A question and its gold number. `terms` are the stored values it needs, as dicts of table, column, year
    (and segment); `formula` says how they combine: value (a), difference (b - a), growth ((b - a) / a * 100),
    average (mean), percent (a / b * 100), ratio (a / b), growth_gap (growth(a, b) - growth(c, d))."""

    kind: str
    formula: str
    text: str
    unit: str  # usd_millions | percent | ratio
    terms: tuple[dict, ...]
    gold: float
    measure: str | None = None  # the named ratio of margin, ratio and multi-table kinds (e.g. gross_margin)

    @property
    def tables(self) -> list[str]:
        return sorted({t["table"] for t in self.terms})


UNIT_TEXT = {"usd_millions": "Answer in USD millions.", "percent": "Answer as a percentage, to two decimal places.",
             "ratio": "Answer as a ratio (a plain number), to three decimal places."}

MONEY = {  # (table, column) -> how a question names it
    ("income_statement", "revenue"): "revenue", ("income_statement", "cost_of_revenue"): "cost of revenue",
    ("income_statement", "gross_profit"): "gross profit",
    ("income_statement", "research_and_development"): "research and development expense",
    ("income_statement", "selling_general_admin"): "selling, general and administrative expense",
    ("income_statement", "operating_expenses"): "total operating expenses",
    ("income_statement", "operating_income"): "operating income",
    ("income_statement", "interest_expense"): "interest expense",
    ("income_statement", "income_tax"): "income tax expense", ("income_statement", "net_income"): "net income",
    ("balance_sheet", "cash_and_equivalents"): "year-end cash and cash equivalents",
    ("balance_sheet", "accounts_receivable"): "year-end accounts receivable",
    ("balance_sheet", "inventory"): "year-end inventory", ("balance_sheet", "total_assets"): "total assets",
    ("balance_sheet", "total_liabilities"): "total liabilities",
    ("balance_sheet", "long_term_debt"): "long-term debt",
    ("balance_sheet", "shareholders_equity"): "shareholders' equity",
    ("cash_flow", "operating_cash_flow"): "operating cash flow",
    ("cash_flow", "capital_expenditure"): "capital expenditure",
    ("cash_flow", "free_cash_flow"): "free cash flow",
    ("cash_flow", "depreciation_amortization"): "depreciation and amortization",
    ("cash_flow", "dividends_paid"): "dividends paid",
}
# name -> (phrase, numerator, denominator, unit); the single-table ones are asked in train and eval-single
SINGLE_RATIOS = {
    "gross_margin": ("gross margin (gross profit as a percentage of revenue)",
                     ("income_statement", "gross_profit"), ("income_statement", "revenue"), "percent"),
    "operating_margin": ("operating margin (operating income as a percentage of revenue)",
                         ("income_statement", "operating_income"), ("income_statement", "revenue"), "percent"),
    "net_margin": ("net profit margin (net income as a percentage of revenue)",
                   ("income_statement", "net_income"), ("income_statement", "revenue"), "percent"),
    "rd_intensity": ("research and development expense as a percentage of revenue",
                     ("income_statement", "research_and_development"), ("income_statement", "revenue"), "percent"),
    "effective_tax_rate": ("effective tax rate (income tax as a percentage of pretax income)",
                           ("income_statement", "income_tax"), ("income_statement", "pretax_income"), "percent"),
    "equity_ratio": ("shareholders' equity as a percentage of total assets",
                     ("balance_sheet", "shareholders_equity"), ("balance_sheet", "total_assets"), "percent"),
    "capex_to_ocf": ("capital expenditure as a percentage of operating cash flow",
                     ("cash_flow", "capital_expenditure"), ("cash_flow", "operating_cash_flow"), "percent"),
    "current_ratio": ("current ratio (total current assets divided by total current liabilities)",
                      ("balance_sheet", "total_current_assets"), ("balance_sheet", "total_current_liabilities"),
                      "ratio"),
    "debt_to_equity": ("debt-to-equity ratio (long-term debt divided by shareholders' equity)",
                       ("balance_sheet", "long_term_debt"), ("balance_sheet", "shareholders_equity"), "ratio"),
}
MULTI_RATIOS = {
    "fcf_to_net_income": ("free cash flow as a percentage of net income (from the income statement)",
                          ("cash_flow", "free_cash_flow"), ("income_statement", "net_income"), "percent"),
    "return_on_equity": ("return on equity (net income as a percentage of year-end shareholders' equity)",
                         ("income_statement", "net_income"), ("balance_sheet", "shareholders_equity"), "percent"),
    "return_on_assets": ("return on assets (net income as a percentage of year-end total assets)",
                         ("income_statement", "net_income"), ("balance_sheet", "total_assets"), "percent"),
    "fcf_margin": ("free cash flow margin (free cash flow as a percentage of revenue)",
                   ("cash_flow", "free_cash_flow"), ("income_statement", "revenue"), "percent"),
    "capex_to_revenue": ("capital expenditure as a percentage of revenue",
                         ("cash_flow", "capital_expenditure"), ("income_statement", "revenue"), "percent"),
    "asset_turnover": ("asset turnover (revenue divided by year-end total assets)",
                       ("income_statement", "revenue"), ("balance_sheet", "total_assets"), "ratio"),
    "cash_conversion": ("cash conversion (operating cash flow divided by net income)",
                        ("cash_flow", "operating_cash_flow"), ("income_statement", "net_income"), "ratio"),
}
GROWTH_GAPS = (  # growth of the first minus growth of the second, in percentage points
    (("income_statement", "revenue"), ("balance_sheet", "total_assets")),
    (("cash_flow", "free_cash_flow"), ("income_statement", "net_income")),
    (("cash_flow", "operating_cash_flow"), ("income_statement", "revenue")),
)
# questions per company and kind (drawn at random from every valid combination)
QUOTAS = {
    "train": {"value": 40, "difference": 30, "growth": 30, "average": 15, "margin": 25, "ratio": 15},
    "eval-single": {"value": 12, "difference": 10, "growth": 10, "average": 5, "margin": 10, "ratio": 5},
    "eval-multi": {**{kind: 6 for kind in MULTI_RATIOS}, "segment_share": 10, "growth_gap": 8},
}


def _term(table: str, column: str, year: int, segment: str | None = None) -> dict:
    return {"table": table, "column": column, "year": year, **({"segment": segment} if segment else {})}


def _growth(a: float, b: float) -> float:
    return (b - a) / a * 100


def make_questions(company: Company, split: str) -> list[Question]:
    """The questions of one company in `split`: every valid combination per kind, shuffled, up to its quota."""
    rng = random.Random(f"finance-questions:{company.seed}:{split}:{company.index}")
    v = company.value
    who = company.name
    pools: dict[str, list[Question]] = {kind: [] for kind in QUOTAS[split]}
    pairs = list(itertools.combinations(YEARS, 2))

    def add(kind, formula, text, unit, terms, gold, measure=None):
        # at the precision the question asks for, rounding must stay within the 1% tolerance
        if (unit == "percent" and abs(gold) < 0.5) or (unit == "ratio" and abs(gold) < 0.05):
            return
        pools[kind].append(Question(kind, formula, f"{text} {UNIT_TEXT[unit]}", unit, tuple(terms), gold, measure))

    if split != "eval-multi":
        money = list(MONEY.items()) + [(("segment_revenue", "revenue", seg), f"revenue of the {seg} segment")
                                       for seg in company.segments]
        for key, label in money:
            table, column, *segment = key
            seg = segment[0] if segment else None
            for year in YEARS:
                add("value", "value", f"What was {who}'s {label} in fiscal {year}?", "usd_millions",
                    [_term(table, column, year, seg)], v(table, column, year, seg))
            for y1, y2 in pairs:
                a, b = v(table, column, y1, seg), v(table, column, y2, seg)
                terms = [_term(table, column, y1, seg), _term(table, column, y2, seg)]
                if abs(b - a) >= 0.5:
                    add("difference", "difference", f"By how much did {who}'s {label} change from fiscal {y1} "
                        f"to fiscal {y2}? Give the change as fiscal {y2} minus fiscal {y1} (negative if it "
                        "fell).", "usd_millions", terms, b - a)
                if a >= 10 and abs(_growth(a, b)) >= 0.05:
                    add("growth", "growth", f"By what percentage did {who}'s {label} grow from fiscal {y1} to "
                        f"fiscal {y2} (negative if it fell)?", "percent", terms, _growth(a, b))
            for y1, y2 in pairs:
                if y2 - y1 >= 2:
                    years = range(y1, y2 + 1)
                    add("average", "average", f"What was {who}'s average annual {label} over fiscal {y1} to "
                        f"fiscal {y2} inclusive?", "usd_millions", [_term(table, column, y, seg) for y in years],
                        sum(v(table, column, y, seg) for y in years) / len(years))
        for name, (phrase, num, den, unit) in SINGLE_RATIOS.items():
            for year in YEARS:
                a, b = v(*num, year), v(*den, year)
                if b > 1:
                    add("margin" if unit == "percent" else "ratio", unit, f"What was {who}'s {phrase} in fiscal "
                        f"{year}?", unit, [_term(*num, year), _term(*den, year)],
                        a / b * (100 if unit == "percent" else 1), name)
    else:
        for name, (phrase, num, den, unit) in MULTI_RATIOS.items():
            for year in YEARS:
                a, b = v(*num, year), v(*den, year)
                if b > 1:
                    add(name, unit, f"What was {who}'s {phrase} in fiscal {year}?", unit,
                        [_term(*num, year), _term(*den, year)], a / b * (100 if unit == "percent" else 1), name)
        for seg in company.segments:
            for year in YEARS:
                a, b = v("segment_revenue", "revenue", year, seg), v("income_statement", "revenue", year)
                add("segment_share", "percent", f"What share of {who}'s total revenue (as reported in the income "
                    f"statement) came from its {seg} segment in fiscal {year}?", "percent",
                    [_term("segment_revenue", "revenue", year, seg), _term("income_statement", "revenue", year)],
                    a / b * 100)
        for (first, second), (y1, y2) in itertools.product(GROWTH_GAPS, pairs):
            a, b, c, d = v(*first, y1), v(*first, y2), v(*second, y1), v(*second, y2)
            if min(a, c) >= 10:
                add("growth_gap", "growth_gap", f"From fiscal {y1} to fiscal {y2}, by how many percentage points "
                    f"did the growth of {who}'s {MONEY[first]} exceed the growth of its {MONEY[second]} "
                    "(negative if it grew less)?", "percent",
                    [_term(*first, y1), _term(*first, y2), _term(*second, y1), _term(*second, y2)],
                    _growth(a, b) - _growth(c, d))

    questions = []
    for kind, quota in QUOTAS[split].items():
        pool = pools[kind]
        rng.shuffle(pool)
        questions += pool[:quota]
    return questions
